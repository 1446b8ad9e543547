"""The two stages of the timed trials: each eager proposal alone, then the faster ones combined
(with each compiling backend on top), on proposals from the real rules and simulated step times."""
from __future__ import annotations

import random

from helpers import FakeClock
from hotloop.engine.strategy import Strategy
from hotloop.tools.hardware import HardwareInfo
from hotloop.tools.model_facts import ModelFacts
from hotloop.tools.proposals import baseline_strategy, propose
from hotloop.tools.significance import compare_paired
from hotloop.tools.ranking import against
from hotloop.tools.stages import (ALL_FASTER, ALL_NOT_SLOWER, ALL_PROPOSED, COMBINED_FIRST_MARGIN,
                                  TIE_ROUNDS_FACTOR, combined_first,
                                  faster_labels, not_slower_labels, run_in_stages, stage_one, stage_one_price,
                                  stage_two, stage_two_price, undecided)
from hotloop.tools.trials import MIN_MEASURED, Budget, Trial, TrialRunner

TWO_CORES = HardwareInfo("cpu", 2, "test cpu", ())
#: a conv net of many small ops: channels_last, fewer threads, the fused update and both backends
CONV_NET = ModelFacts("m.M", 1000, {"conv2d": 10}, 0, True, 2e9, 2000, {"conv": 1.0})


def conv_proposals(with_pair: bool = False):
    """The rules' timed proposals (the stage mechanics: without the fused update timed in channels_last,
    unless ``with_pair``)."""
    return [p for p in propose(CONV_NET, TWO_CORES, available_backends=("graph", "inductor"),
                               planned_seconds=1e5) if p.timed
            and (with_pair or p.label != "fused_optimizer in channels_last")]


def test_stage_one_times_every_proposal_that_compiles_nothing_alone():
    timed = conv_proposals(with_pair=True)
    assert {p.label for p in stage_one(timed)} == {"channels_last", "threads=1", "fused_optimizer",
                                                   "fused_optimizer in channels_last"}
    only = [p for p in timed if p.label == "backend=inductor"]
    assert stage_one(only) == only                      # one proposal: one stage


def test_stage_two_combines_only_what_measured_faster_and_puts_each_backend_on_top():
    timed = conv_proposals()
    order = stage_two(timed, ["channels_last", "fused_optimizer"])
    assert [p.label for p in order] == [ALL_FASTER, f"{ALL_FASTER} + backend=inductor",
                                        f"{ALL_FASTER} + backend=graph", "backend=inductor", "backend=graph"]
    expert = order[0].changes                           # the expert's eager settings
    assert expert["channels_last"] and expert["fused_kernel"] and "backend" not in expert
    assert "intra_op_threads" not in expert
    assert order[1].changes["backend"] == "inductor" and order[1].changes["channels_last"]
    assert order[1].compile_cost > 0
    one = stage_two(timed, ["fused_optimizer"])         # one faster: it was timed alone already
    assert [p.label for p in one][0] == f"{ALL_FASTER} + backend=inductor"
    assert "channels_last" not in one[0].changes
    assert [p.label for p in stage_two(timed, [])] == ["backend=inductor", "backend=graph"]


def test_stage_two_adds_the_ties_to_a_combination_of_their_own():
    timed = conv_proposals()
    order = stage_two(timed, ["channels_last"], ["channels_last", "fused_optimizer"])
    assert [p.label for p in order][:2] == [ALL_NOT_SLOWER, f"{ALL_FASTER} + backend=inductor"]
    assert order[0].changes["channels_last"] and order[0].changes["fused_kernel"]
    assert "fused_kernel" not in order[1].changes          # the backends go on top of the faster ones only
    both = stage_two(timed, ["channels_last", "threads=1"], ["channels_last", "threads=1", "fused_optimizer"])
    assert [p.label for p in both][:2] == [ALL_FASTER, ALL_NOT_SLOWER]
    assert stage_two(timed, ["channels_last"], ["channels_last"])[0].label != ALL_NOT_SLOWER   # no ties


def _measured(label: str, times: list[float]) -> Trial:
    trial = Trial(label, baseline_strategy(), "test", status="ok")
    trial.step_times, trial.step_rounds = list(times), list(range(len(times)))
    return trial


def test_not_slower_means_not_slower_with_90_percent_confidence():
    reference = _measured("eager", [0.100, 0.102, 0.098, 0.101, 0.099, 0.100])
    tie = _measured("tie", [0.101, 0.100, 0.100, 0.102, 0.098, 0.101])        # ratio just above 1, in noise
    slower = _measured("slower", [0.110, 0.112, 0.108, 0.111, 0.109, 0.110])
    faster = _measured("faster", [0.090, 0.092, 0.088, 0.091, 0.089, 0.090])
    trials = [reference, tie, slower, faster]
    assert faster_labels(trials, reference) == ["faster"]
    assert not_slower_labels(trials, reference) == ["tie", "faster"]


class _SimulatedRunner(TrialRunner):
    """Step seconds from the Strategy: 100 ms eager, x0.8 channels_last, x0.95 fused update,
    x1.4 one thread, x0.7 inductor (its first step ``compile_seconds``, 5 s); a little alternating jitter,
    and with ``noise`` a uniform random factor within 1 +- noise (seeded)."""

    def __init__(self, clock: FakeClock, compile_seconds: float = 5.0, fused: float = 0.95,
                 noise: float = 0.0, seed: int = 0) -> None:
        self.clock, self.warmup, self.round, self.step_calls, self.rounds_started = clock, 2, -1, 0, 0
        self.compile_seconds, self.fused = compile_seconds, fused
        self.noise, self.random = noise, random.Random(seed)

    def prepare(self, trial: Trial) -> bool:
        trial.status, trial.runner = "ok", object()
        return True

    def step(self, trial: Trial) -> float:
        s = trial.strategy
        seconds = 0.1 * (0.8 if s.channels_last else 1) * (self.fused if s.fused_optimizer else 1)
        seconds *= (1.4 if s.intra_op_threads == 1 else 1) * (0.7 if s.backend == "inductor" else 1)
        seconds *= (1.0 + 0.01 * (self.step_calls % 3)) * (1.0 + self.noise * self.random.uniform(-1.0, 1.0))
        if s.backend == "inductor" and trial.steps_run == 0:
            seconds = self.compile_seconds
        self.clock.now += seconds
        self.step_calls += 1
        self.record(trial, 1.0, seconds)
        return seconds


def _started(compile_seconds: float = 5.0, fused: float = 0.95,
             noise: float = 0.0, seed: int = 0) -> tuple[FakeClock, _SimulatedRunner, Strategy, Trial]:
    """A simulated runner whose eager reference has taken its warm-up step."""
    clock = FakeClock()
    runner = _SimulatedRunner(clock, compile_seconds, fused, noise, seed)
    base = baseline_strategy()
    reference = Trial("eager", base, "reference", warmup=1)
    runner.prepare(reference)
    runner.step(reference)
    return clock, runner, base, reference


def test_a_slow_setting_alone_stays_out_of_every_combination_and_stage_two_pairs_with_eager():
    clock, runner, base, reference = _started()
    timed = [p for p in conv_proposals() if p.label != "backend=graph"]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(200.0, clock=clock), reserve_steps=6)
    by_label = {t.label: t for t in trials}
    assert set(faster_labels(trials, reference)) >= {"channels_last", "fused_optimizer", ALL_FASTER}
    assert "threads=1" not in faster_labels(trials, reference)
    expert, compiled = by_label[ALL_FASTER], by_label[f"{ALL_FASTER} + backend=inductor"]
    for t in (expert, compiled):
        assert t.strategy.intra_op_threads == 0 and t.strategy.channels_last and t.strategy.fused_optimizer
        assert t.measured
        comparison = compare_paired(t.step_times, t.step_rounds, reference.step_times, reference.step_rounds)
        assert comparison.paired                             # eager stepped in stage two's rounds too
    first_rounds = {r for t in trials[:3] for r in t.step_rounds}
    assert min(expert.step_rounds) > max(first_rounds)      # stage two numbers its rounds on
    ratio = compare_paired(compiled.step_times, compiled.step_rounds, reference.step_times, reference.step_rounds)
    assert abs(ratio.ratio - 0.8 * 0.95 * 0.7) < 0.03
    assert by_label["backend=inductor"].strategy == base.replace(backend="inductor")


def test_a_stage_two_candidate_already_timed_in_stage_one_is_not_timed_again():
    clock, runner, base, reference = _started()
    timed = [p for p in conv_proposals() if p.label in ("channels_last", "backend=inductor")]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(200.0, clock=clock))
    strategies = [t.strategy for t in trials]
    assert len(strategies) == len(set(strategies)) == 3     # channels_last, + inductor, inductor alone
    assert Strategy() not in strategies


def test_stage_two_admits_a_compile_that_fits_once_no_cheap_candidate_waits():
    """Stage two's compile (priced 40 s) fits the 60 s left but not twice over: with the faster
    eager settings already admitted, it is timed (in stage one's queue it would wait)."""
    clock, runner, base, reference = _started()
    timed = [p for p in conv_proposals() if p.label in ("channels_last", "fused_optimizer", "backend=inductor")]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(66.0, clock=clock))
    compiled = next(t for t in trials if t.label == f"{ALL_FASTER} + backend=inductor")
    assert compiled.measured, compiled.status


def test_without_a_compiling_proposal_the_faster_ones_are_still_combined():
    clock, runner, base, reference = _started()
    timed = [p for p in conv_proposals() if p.compile_cost == 0]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(60.0, clock=clock))
    expert = next(t for t in trials if t.label == ALL_FASTER)
    assert expert.measured and expert.strategy.channels_last and expert.strategy.fused_optimizer


def test_the_eager_combination_is_measured_before_a_compile_that_overruns_its_price():
    """The compile is priced 40 s but takes 90 s, more than the budget has left: the faster eager
    settings combined are still timed to the end (their rounds come before the compile's)."""
    clock, runner, base, reference = _started(compile_seconds=90.0)
    timed = [p for p in conv_proposals() if p.label in ("channels_last", "fused_optimizer", "backend=inductor")]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(120.0, clock=clock))
    by_label = {t.label: t for t in trials}
    expert = by_label[ALL_FASTER]
    assert expert.measured and len(expert.step_times) >= 8, expert.status
    compiled = by_label[f"{ALL_FASTER} + backend=inductor"]
    assert all(r > max(expert.step_rounds) for r in compiled.step_rounds)   # none, when it does not fit
    assert compiled.status != "ok" or compiled.step_rounds
    ratio = compare_paired(expert.step_times, expert.step_rounds, reference.step_times, reference.step_rounds)
    assert abs(ratio.ratio - 0.8 * 0.95) < 0.03


def test_a_setting_that_ties_alone_is_timed_beside_the_faster_one():
    """The fused update changes nothing here (x1.0): alone it is no faster, and channels_last is the
    only faster proposal; ``all not slower`` times the two together."""
    clock, runner, base, reference = _started(fused=1.0)
    timed = [p for p in conv_proposals() if p.compile_cost == 0]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(60.0, clock=clock))
    by_label = {t.label: t for t in trials}
    assert "fused_optimizer" not in faster_labels(trials, reference)
    assert "fused_optimizer" in not_slower_labels(trials, reference)
    assert "threads=1" not in not_slower_labels(trials, reference)
    wider = by_label[ALL_NOT_SLOWER]
    assert wider.measured and wider.strategy.channels_last and wider.strategy.fused_optimizer
    assert wider.strategy.intra_op_threads == 0


def test_the_ties_combination_is_timed_after_the_compiles():
    clock, runner, base, reference = _started(fused=1.0)
    timed = [p for p in conv_proposals() if p.label != "backend=graph"]
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(400.0, clock=clock))
    by_label = {t.label: t for t in trials}
    wider, compiled = by_label[ALL_NOT_SLOWER], by_label[f"{ALL_FASTER} + backend=inductor"]
    assert wider.measured and compiled.measured, (wider.status, compiled.status)
    assert min(wider.step_rounds) > max(compiled.step_rounds)


def test_a_tie_alone_gets_more_rounds_from_what_stage_two_leaves():
    """The fused update ties with eager (x1.0). With 400 s, stage two priced in full leaves room:
    the tie gets rounds up to TIE_ROUNDS_FACTOR x 10 steps, paired with eager, the decided ones none;
    with 60 s it leaves none and the tie keeps its 10 steps."""
    clock, runner, base, reference = _started(fused=1.0)
    timed = [p for p in conv_proposals() if p.label != "backend=graph"]
    by_label = {t.label: t for t in run_in_stages(runner, timed, reference, base, 10, Budget(400.0, clock=clock),
                                                  reserve_steps=6)}
    tie = by_label["fused_optimizer"]
    first_ten = compare_paired(tie.step_times[:10], tie.step_rounds[:10], reference.step_times, reference.step_rounds)
    assert len(tie.step_times) == TIE_ROUNDS_FACTOR * 10
    assert against(tie, reference).pairs == first_ten.pairs + 20                # every extra step paired
    assert len(by_label["channels_last"].step_times) == len(by_label["threads=1"].step_times) == 10
    assert all(t.measured for t in by_label.values()), {t.label: t.status for t in by_label.values()}
    clock, runner, base, reference = _started(fused=1.0)
    tight = {t.label: t for t in run_in_stages(runner, timed, reference, base, 10, Budget(60.0, clock=clock),
                                               reserve_steps=6)}
    assert len(tight["fused_optimizer"].step_times) == 10
    assert tight[f"{ALL_FASTER} + backend=inductor"].measured      # the compile keeps its rounds


def test_more_rounds_settle_a_gain_that_ten_rounds_leave_in_noise():
    """A 3% faster fused update under +-6% step noise: on its first 10 rounds its interval holds 1 and
    its ratio is above 1 (it would stay out of ``all faster``); the extra rounds narrow the interval
    below 1, so it joins the faster settings and their combination."""
    timed = [p for p in conv_proposals() if p.compile_cost == 0]
    clock, runner, base, reference = _started(fused=0.97, noise=0.06, seed=0)
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(400.0, clock=clock))
    fused = next(t for t in trials if t.label == "fused_optimizer")
    first_ten = compare_paired(fused.step_times[:10], fused.step_rounds[:10], reference.step_times,
                               reference.step_rounds)
    assert first_ten.lower <= 1.0 <= first_ten.ratio < first_ten.upper    # on stage one's rounds: a tie, left out
    assert 10 < len(fused.step_times) < TIE_ROUNDS_FACTOR * 10          # extended until it was decided
    assert against(fused, reference).upper < 1.0 and "fused_optimizer" in faster_labels(trials, reference)
    assert next(t for t in trials if t.label == ALL_FASTER).strategy.fused_optimizer
    assert not undecided(trials, reference, TIE_ROUNDS_FACTOR * 10)


def test_stage_two_is_priced_at_eager_steps_plus_compiles_and_eager_rounds_per_part():
    _, _, base, reference = _started()
    reference.step_times = [0.1] * 4
    eager = Trial(ALL_FASTER, base.replace(channels_last=True), "t")
    compiled = Trial("inductor", base.replace(backend="inductor"), "t", compile_cost=40.0)
    assert stage_two_price([], reference, 2, 10) == 0.0
    assert abs(stage_two_price([eager, compiled], reference, 2, 10) - (2 * 12 * 0.1 + 40.0 + 2 * 10 * 0.1)) < 1e-9


def test_a_formulation_timed_in_a_layout_must_beat_the_layout_alone_to_join_the_combination():
    # DeepLabV3+ (bf16 zoo run): channels_last alone 42.4 ms, the 1x1 GEMM timed in channels_last
    # 43.0 ms, eager 48.0 ms: the GEMM is faster than eager only through the layout
    def trial(label: str, changes: dict, times: list[float]) -> Trial:
        measured = _measured(label, times)
        measured.strategy = baseline_strategy().replace(**changes)
        return measured
    reference = trial("eager", {}, [0.0480, 0.0482, 0.0478, 0.0481, 0.0479, 0.0480])
    layout = trial("channels_last", {"channels_last": True}, [0.0424, 0.0426, 0.0422, 0.0425, 0.0423, 0.0424])
    gemm = trial("pointwise_conv=gemm", {"channels_last": True, "pointwise_conv": "gemm"},
                 [0.0430, 0.0432, 0.0428, 0.0431, 0.0429, 0.0430])
    norm = trial("instance_norm=per_sample", {"channels_last": True, "instance_norm": "per_sample"},
                 [0.0400, 0.0402, 0.0398, 0.0401, 0.0399, 0.0400])
    trials = [reference, layout, gemm, norm]
    assert faster_labels(trials, reference) == ["channels_last", "instance_norm=per_sample"]
    assert not_slower_labels(trials, reference) == ["channels_last", "instance_norm=per_sample"]
    slow_layout = trial("channels_last", {"channels_last": True}, [0.0500, 0.0502, 0.0498, 0.0501, 0.0499, 0.0500])
    assert faster_labels([reference, slow_layout, gemm], reference) == ["pointwise_conv=gemm"]   # beats both


def test_a_formulation_slower_than_its_layout_within_noise_is_no_tie_to_keep():
    # DeepLabV3+ (bf16 zoo run): the 1x1 GEMM in channels_last 2% slower than channels_last alone by
    # the paired ratio, within noise (its interval holds 1): it stays out of ``all not slower`` too
    def trial(label: str, changes: dict, times: list[float]) -> Trial:
        measured = _measured(label, times)
        measured.strategy = baseline_strategy().replace(**changes)
        return measured
    reference = trial("eager", {}, [0.0517, 0.0515, 0.0519, 0.0516, 0.0518, 0.0517, 0.0516, 0.0518])
    layout = trial("channels_last", {"channels_last": True},
                   [0.0448, 0.0462, 0.0436, 0.0455, 0.0441, 0.0449, 0.0458, 0.0440])
    gemm = trial("pointwise_conv=gemm", {"channels_last": True, "pointwise_conv": "gemm"},
                 [0.0466, 0.0445, 0.0470, 0.0449, 0.0467, 0.0452, 0.0448, 0.0462])
    trials = [reference, layout, gemm]
    vs_layout = against(gemm, layout)
    assert vs_layout.lower <= 1.0 < vs_layout.ratio            # slower than the layout by the ratio, within noise
    assert against(gemm, reference).upper < 1.0                 # faster than eager through the layout
    assert not_slower_labels(trials, reference) == ["channels_last"]
    tie = trial("fused_optimizer", {"fused_optimizer": True},  # a tie with eager, held to nothing: kept
                [0.0519, 0.0510, 0.0522, 0.0512, 0.0520, 0.0511, 0.0517, 0.0513])
    assert not_slower_labels([reference, layout, tie], reference) == ["channels_last", "fused_optimizer"]


def test_a_budget_short_of_stage_one_times_every_eager_proposal_combined_first():
    """Two proposals need 2 x (2 + 3) eager steps plus 3 paired ones to be judged at all, and their
    combination 2 + 3 + 3 more (2.1 s at 100 ms); with 3.0 s, less than twice that, the combination
    is timed first and measured, ahead of the singles; with 200 s it is not built."""
    timed = [p for p in conv_proposals() if p.label in ("channels_last", "fused_optimizer")]
    clock, runner, base, reference = _started()
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(3.0, clock=clock))
    combined = trials[0]
    assert combined.label == ALL_PROPOSED and combined.measured, combined.status
    assert combined.strategy.channels_last and combined.strategy.fused_optimizer
    ratio = compare_paired(combined.step_times, combined.step_rounds, reference.step_times, reference.step_rounds)
    assert ratio.paired and abs(ratio.ratio - 0.8 * 0.95) < 0.03
    assert not any(t.measured for t in trials if t.label == ALL_FASTER)      # stage two never got there
    clock, runner, base, reference = _started()
    roomy = run_in_stages(runner, timed, reference, base, 10, Budget(200.0, clock=clock))
    assert ALL_PROPOSED not in {t.label for t in roomy} and any(t.label == ALL_FASTER for t in roomy)


def test_the_combination_first_is_priced_on_stage_ones_minimum():
    timed = [p for p in conv_proposals() if p.compile_cost == 0]        # channels_last, threads=1, fused update
    assert abs(stage_one_price(timed, 0.1, 2, 10) - (3 * 12 * 0.1 + 10 * 0.1)) < 1e-9
    minimum = stage_one_price(timed, 0.1, 2, MIN_MEASURED)              # 3 x 5 + 3 eager steps
    assert abs(minimum - 1.8) < 1e-9
    minimum += (2 + 2 * MIN_MEASURED) * 0.1                              # then the combination
    assert combined_first(timed, 0.1, 2, COMBINED_FIRST_MARGIN * minimum + 0.01) is None    # fits twice over
    combined = combined_first(timed, 0.1, 2, COMBINED_FIRST_MARGIN * minimum - 0.01)
    assert combined is not None and combined.label == ALL_PROPOSED
    assert combined.rule.startswith(f"timed first: judging 3 settings alone and then combined needs ~{minimum:.1f}")
    assert combined.changes["channels_last"] and combined.changes["fused_optimizer"]
    assert "intra_op_threads" not in combined.changes                    # threads=1 is timed alone only
    assert combined_first(timed, 0.0, 2, 0.1) is None                    # eager's step unknown: no guess
    assert combined_first(timed[:1], 0.1, 2, 0.1) is None                # one proposal: nothing to combine
    assert combined_first([p for p in timed if p.label != "fused_optimizer"], 0.1, 2, 0.1) is None  # + threads


def test_a_single_with_the_combinations_strategy_is_not_timed_again():
    """With the fused update timed in channels_last beside both parts, the combination of all three is
    that pair's Strategy: timed once, as ``all proposed``."""
    timed = [p for p in conv_proposals(with_pair=True) if p.compile_cost == 0 and p.label != "threads=1"]
    clock, runner, base, reference = _started()
    trials = run_in_stages(runner, timed, reference, base, 10, Budget(3.0, clock=clock))
    pair = next(p for p in timed if p.label == "fused_optimizer in channels_last").apply(base)
    assert trials[0].label == ALL_PROPOSED and trials[0].strategy == pair
    assert [t.label for t in trials].count("fused_optimizer in channels_last") == 0
    strategies = [t.strategy for t in trials]
    assert len(strategies) == len(set(strategies))
