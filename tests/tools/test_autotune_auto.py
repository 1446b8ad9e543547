"""The autotuner end to end on tiny models: budget, parity guard, cache, isolation, user models."""
from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest
import torch

from hotloop.engine import build as engine_step
from hotloop.engine.step_parts import StepResult
from hotloop.engine.strategy import Strategy
from hotloop.registry import models
from hotloop.tools.autotune import read_batches, tune
from hotloop.tools.tune_budget import DEFAULT_BUDGET_FRACTION
from hotloop.tools.isolation import preserved_process_state
from hotloop.tools.proposals import Proposal, baseline_strategy
from hotloop.tools.trials import Trial, TrialRunner
from hotloop.tools.tune_cache import TuneCacheWarning

pytestmark = pytest.mark.timeout(120)

QUIET = dict(log=lambda line: None, max_trial_steps=3, num_batches=6)
#: tests that need candidates measured: a budget a loaded 2-core machine cannot exhaust on these
#: tiny models (tuning still ends as soon as every candidate has its steps)
ROOMY = 60.0
RETIME_ROUNDS = 24        # interleaved rounds of the independent re-timing
RETIME_SLACK = 1.25       # noise allowance of that re-timing (medians of 24 steps each)


def _retime(model, problem, hp, strategies: dict[str, Strategy]) -> dict[str, float]:
    """Median step seconds of each strategy, measured afresh: own runner, interleaved rounds,
    alternating order; independent of the tuner's own trials."""
    batches, _ = read_batches(problem, hp, 6, torch.device("cpu"))
    runner = TrialRunner(model, hp, batches, torch.device("cpu"), warmup=2)
    trials = [Trial(label, strategy, "re-timing") for label, strategy in strategies.items()]
    with preserved_process_state():
        assert all(runner.prepare(t) for t in trials), [t.status for t in trials]
        for round_ in range(runner.warmup + RETIME_ROUNDS):
            for trial in (trials if round_ % 2 == 0 else trials[::-1]):
                runner.step(trial)
    assert all(t.status == "ok" for t in trials), [t.status for t in trials]
    return {t.label: t.median for t in trials}


def test_auto_choice_is_not_slower_than_eager_when_timed_again(tiny_model, copy_problem, tiny_hp):
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=ROOMY, cache=False, **QUIET)
    by_label = {t.label: t for t in report.trials}
    eager = by_label["eager"]
    assert eager.measured
    assert any(t.measured for t in report.trials if t is not eager)   # some proposal was actually timed
    assert report.chosen in by_label
    assert isinstance(report.strategy, Strategy)
    report.strategy.validate("cpu")
    assert "candidate" in report.table() and "eager" in report.table()
    # the claim, checked by a measurement the choice did not see
    medians = _retime(tiny_model, copy_problem, tiny_hp,
                      {"eager": baseline_strategy(), "chosen": report.strategy})
    assert medians["chosen"] <= medians["eager"] * RETIME_SLACK, (report.chosen, medians)


def test_retiming_tells_a_slower_strategy_apart(tiny_model, copy_problem, tiny_hp):
    """The re-timing above can fail: it sees a strategy that does three times the work."""
    triple = tiny_hp.replace(accum_steps=3)          # 3 micro-batches per optimizer step
    tripled = _retime(tiny_model, copy_problem, triple, {"eager": baseline_strategy()})
    single = _retime(tiny_model, copy_problem, tiny_hp, {"eager": baseline_strategy()})
    assert tripled["eager"] > single["eager"] * RETIME_SLACK, (tripled, single)


def test_tiny_budget_bounds_the_number_of_trial_steps(tiny_model, copy_problem, tiny_hp):
    nothing = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=0.0, cache=False, **QUIET)
    assert nothing.step_calls == 1                               # one eager step, then the cap stops it
    assert nothing.chosen == "default (not tuned)" and nothing.strategy == Strategy()
    assert [t.label for t in nothing.trials] == ["eager"] and "tuning skipped" in nothing.notes[0]
    # a planned run of 40 steps at 4% leaves room for ~1.6 eager steps: calibration uses it up;
    # no candidate's first step fits what is left, so nothing else gets measured
    short = tune(tiny_model, copy_problem, tiny_hp, "cpu", 40, max_seconds=20, cache=False, **QUIET)
    others = [t for t in short.trials if t.label != "eager"]
    assert not any(t.step_times for t in others) and sum(t.steps_run for t in others) <= 1
    assert short.chosen in ("eager", "default (not tuned)")
    assert short.step_calls <= 1 + 1 + 3                          # first step + counting step + calibration


def test_max_time_caps_the_planned_run(tiny_model, copy_problem, tiny_hp):
    """A run capped at 4 s by max_time gets at most 4% of 4 s, however many steps it plans."""
    capped = tune(tiny_model, copy_problem, tiny_hp, "cpu", 10**6, max_seconds=20, cache=False,
                  planned_seconds=4.0, **QUIET)
    assert capped.budget_seconds == pytest.approx(4.0 * DEFAULT_BUDGET_FRACTION) == pytest.approx(0.16)
    # 10^8 steps: 4% of them is past the 20 s cap however fast the tiny model's step
    unbounded = tune(tiny_model, copy_problem, tiny_hp, "cpu", 10**8, max_seconds=20, compile_max_seconds=20,
                     cache=False, **QUIET)
    assert unbounded.budget_seconds == pytest.approx(20.0)


def test_a_run_that_repays_a_compile_gets_the_compile_cap(tiny_model, copy_problem, tiny_hp):
    """10^8 planned steps repay a compile, so the cap is compile_max_seconds (the planned run's 4%
    still applies); 100 steps repay none, and max_seconds stays the cap."""
    long = tune(tiny_model, copy_problem, tiny_hp, "cpu", 10**8, max_seconds=0.5, compile_max_seconds=3.0,
                cache=False, **QUIET)
    assert any(t.label == "backend=inductor" or "backend=inductor" in t.rule for t in long.trials)
    assert long.budget_seconds == pytest.approx(3.0)
    short = tune(tiny_model, copy_problem, tiny_hp, "cpu", 100, max_seconds=0.5, compile_max_seconds=3.0,
                 cache=False, **QUIET)
    assert not any("backend=inductor" in t.label for t in short.trials)
    assert short.budget_seconds <= 0.5


def test_parity_guard_rejects_a_candidate_that_changes_results(tiny_model, copy_problem, tiny_hp,
                                                               monkeypatch):
    real = engine_step.compile_step

    def sabotaged(model, loss_fn, optimizer, strategy, **kwargs):
        step = real(model, loss_fn, optimizer, strategy, **kwargs)
        if strategy.sync_every != 7:
            return step

        def wrong(micro_batches, state=None):                  # fast: skips backward and update
            with torch.no_grad():
                out = model.loss(micro_batches[0], state)
            return StepResult(out.loss * 1.01, out.stats, None, None)
        return wrong

    monkeypatch.setattr(engine_step, "compile_step", sabotaged)
    bad = Proposal("wrong", {"sync_every": 7}, "test: deliberately wrong step", expected_gain=9.0)
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=ROOMY, cache=False,
                  extra_proposals=[bad], **QUIET)
    wrong = next(t for t in report.trials if t.label == "wrong")
    assert wrong.measured and wrong.parity.startswith("REJECTED")
    assert report.chosen != "wrong" and report.strategy.sync_every != 7
    assert all(t.parity.startswith("REJECTED") for t in report.trials if t.strategy.sync_every == 7 and t.measured)


def test_parity_guard_rejects_a_bf16_candidate_that_never_updates(tiny_model, copy_problem, tiny_hp,
                                                                 monkeypatch):
    """A bf16 step that skips backward and update: at a small learning rate its losses stay
    within the bf16 loss tolerance (the trial trajectory passes), so check_parity's update
    comparison is what rejects it."""
    real = engine_step.compile_step

    def sabotaged(model, loss_fn, optimizer, strategy, **kwargs):
        step = real(model, loss_fn, optimizer, strategy, **kwargs)
        if strategy.precision != "bf16" or strategy.sync_every != 7:
            return step

        def forward_only(micro_batches, state=None):         # fast: bf16 forward, no update
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                out = model.loss(micro_batches[0], state)
            return StepResult(out.loss.float(), out.stats, None, None)
        return forward_only

    monkeypatch.setattr(engine_step, "compile_step", sabotaged)
    bad = Proposal("wrong bf16", {"precision": "bf16", "sync_every": 7}, "test: bf16 step without update",
                   expected_gain=9.0)
    slow_lr = tiny_hp.replace(learning_rate=5e-4)
    report = tune(tiny_model, copy_problem, slow_lr, "cpu", None, max_seconds=ROOMY, cache=False,
                  extra_proposals=[bad], **QUIET)
    wrong = next(t for t in report.trials if t.label == "wrong bf16")
    assert wrong.measured, wrong.status
    assert wrong.parity.startswith("ok ("), wrong.parity               # losses alone let it through
    assert "REJECTED by check_parity (parameter update wrong: size |d|/|d_ref| 0.00" in wrong.parity, wrong.parity
    assert report.chosen != "wrong bf16" and report.strategy.sync_every != 7


def test_dropout_models_get_the_same_masks_in_every_trial(tiny_model, copy_problem, tiny_hp):
    """Interleaved trials must not shift each other's random stream: with dropout, a
    candidate with the same math (the foreach optimizer) still matches eager bitwise."""
    class Dropping(type(tiny_model)):
        def forward(self, batch, state=None):
            logits, _ = super().forward(batch, state)
            return torch.nn.functional.dropout(logits, 0.5, self.training), None

    torch.manual_seed(0)
    model = Dropping(tiny_hp, copy_problem.spec(tiny_hp))
    report = tune(model, copy_problem, tiny_hp, "cpu", None, max_seconds=ROOMY, cache=False, **QUIET)
    same_math = [t for t in report.trials if t.label == "fused_optimizer" and t.measured]
    assert same_math, [(t.label, t.status) for t in report.trials]
    eager = next(t for t in report.trials if t.label == "eager")
    n = min(len(same_math[0].losses), len(eager.losses))
    # same masks: the same losses up to the one-kernel update's rounding (bitwise where the CPU's
    # vector width gives both updates one summation order; 1-ulp apart on an AVX2-only CPU), where
    # other masks at p=0.5 move them by percents
    assert n >= 3 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(same_math[0].losses[:n], eager.losses[:n]))
    assert same_math[0].parity.startswith(("ok", "not judged: one judged before it passed")), same_math[0].parity
    chosen = next(t for t in report.trials if t.label == report.chosen)
    # check_parity seeds its runs itself: a dropout model's winner passes it (the same masks again)
    assert chosen is eager or "check_parity ok" in chosen.parity, chosen.parity


def test_cache_hits_on_second_call_and_no_cache_bypasses(tiny_model, copy_problem, tiny_hp, private_cache):
    first = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=1, **QUIET)
    assert first.cache == "miss" and first.step_calls > 0
    files = list(private_cache.glob("strategy_*.json"))
    assert len(files) == 1 and (
        json.loads(files[0].read_text())["strategy"] == json.loads(json.dumps(first.strategy.to_dict())))
    second = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=1, **QUIET)
    assert second.cache == "hit" and second.step_calls == 0 and second.strategy == first.strategy
    assert second.rows()                                        # the cached table comes back too
    bypass = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=1, cache=False, **QUIET)
    assert bypass.cache == "disabled" and bypass.step_calls > 0
    other = tune(tiny_model, copy_problem, tiny_hp.replace(batch_size=4), "cpu", None, max_seconds=1, **QUIET)
    assert other.cache == "miss"                                 # another input shape is another key


def test_corrupt_cache_file_is_ignored_with_a_warning(tiny_model, copy_problem, tiny_hp, private_cache):
    first = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=1, **QUIET)
    path = next(private_cache.glob("strategy_*.json"))
    for garbage in ("{not json", json.dumps({"key": "x", "strategy": {}}),
                    json.dumps({"key": json.loads(path.read_text())["key"], "strategy": {"precision": "fp8"}})):
        path.write_text(garbage)
        with pytest.warns(TuneCacheWarning, match="ignoring corrupt autotune cache"):
            again = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=1, **QUIET)
        assert again.cache == "miss" and again.step_calls > 0
    with warnings.catch_warnings():                              # the re-tuned choice was rewritten
        warnings.simplefilter("error", TuneCacheWarning)
        hit = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=1, **QUIET)
    assert hit.cache == "hit" and first.strategy.precision in ("fp32", "bf16")


def test_tuning_leaves_weights_and_rng_untouched(tiny_model, copy_problem, tiny_hp):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    expected = (torch.rand(4), random.random(), np.random.rand())
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    threads = torch.get_num_threads()
    tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=3, cache=False,
         log=lambda line: None)
    after = tiny_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in tiny_model.parameters())
    assert torch.equal(torch.rand(4), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]
    assert torch.get_num_threads() == threads


def test_registered_model_gets_the_same_treatment(copy_problem):
    from hotloop import get_hparams
    hp = get_hparams("transformer_algorithmic", "hidden_size=16,filter_size=32,num_layers=1,"
                     "batch_size=8,num_heads=2")
    model = models.get("transformer")(hp, copy_problem.spec(hp))
    report = tune(model, copy_problem, hp, "cpu", None, max_seconds=3, cache=False, **QUIET)
    assert report.facts is not None and report.facts.layers["attention"] >= 1
    assert report.facts.flop_share["matmul"] > 0.5
    assert any(t.label == "fused_optimizer" for t in report.trials)


def test_candidates_are_compared_with_eager_round_by_round(tiny_model, copy_problem, tiny_hp):
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=ROOMY, cache=False, **QUIET)
    eager = next(t for t in report.trials if t.label == "eager")
    interleaved = {r for r in eager.step_rounds if r >= 0}
    assert interleaved, "eager never stepped inside the interleaved rounds"
    compared = [t for t in report.trials if t is not eager and t.measured]
    assert compared and all(t.comparison for t in compared)
    # a measured candidate shares rounds with eager, and the report shows the paired ratio
    assert any(set(t.step_rounds) & interleaved for t in compared)
    assert "paired rounds" in report.table()
