"""``strategy="auto"``: propose by rules, confirm by interleaved timed trials, guard parity, cache.

1. read one step's batches, time eager fp32's first step (the baseline, always a candidate)
   to size the budget: ``min(max_seconds, budget_fraction * planned run seconds)``, the
   planned run being ``planned_steps * eager_step`` capped by ``planned_seconds`` (``max_time``);
   the budget covers all of tuning from its first batch read, not only the trials. A run
   whose first eager step exceeds it is not tuned (one notice; the default ``Strategy()``);
2. read the other batches (timing the reader), measure the model (FLOPs, op sizes, layers)
   and time eager, each step only while its estimate fits the budget;
3. rules propose candidates (:mod:`hotloop.tools.proposals`); each one that compiles nothing
   is timed alone, then the ones that measured faster combined, with each compiling backend
   on top (:mod:`hotloop.tools.stages`; a budget too short for that times them all combined
   first); the ones that fit the budget run interleaved with the baseline (:mod:`hotloop.tools.trials`);
4. a candidate is chosen only if it beats eager by ``min_gain`` with 90%
   confidence over the rounds where both stepped (:mod:`hotloop.tools.significance`)
   (judged fastest first, a wider candidate within noise of a faster one before it:
   :mod:`hotloop.tools.ranking`) and its loss trajectory matches eager fp32 within the
   engine's tolerance, or within a multiple of the model's own chaos floor (:mod:`hotloop.tools.trajectory`)
   (trial trajectories, then :func:`hotloop.engine.parity.check_parity`, which also
   compares the parameter updates; a candidate drawing other random numbers, bits16
   dropout masks, is judged by check_parity's random-stream rule alone);
5. the winner's own step is fed by the run's reader in line and through the prefetch thread,
   interleaved; reading in line is kept only when it is faster (:mod:`hotloop.tools.feed_trial`);
   the trials leave room for it in the budget;
6. the choice is cached (:mod:`hotloop.tools.tune_cache`).

The caller's model, its weights and every global RNG stream are left as they were. A stop
signal (SIGINT, SIGTERM, SIGUSR1) ends tuning at the next trial step with
:class:`~hotloop.train.interrupt.Interrupted` (:mod:`hotloop.tools.tune_start`).
"""
from __future__ import annotations

import importlib
import os
import time
from typing import Callable, Sequence

import torch
from torch import nn

from ..engine.process_settings import apply_process_settings
from ..engine.compiled_networks import network_types
from ..engine.program import model_phases
from ..engine.parity import REFERENCE, ParityCase, changes_random_stream, check_parity
from ..engine.strategy import Strategy
from ..hparams import HParams
from ..problems.base import Batch, Problem
from .compile_prices import next_compile_prices, record_compile
from .hardware import HardwareInfo, detect_hardware
from .isolation import applied_strategy, preserved_process_state
from .model_facts import ModelFacts, analyze_model, counting, initial_state_for
from .proposals import Proposal, ReaderFacts, baseline_strategy, propose, reduced_precision
from .formulation_candidates import clip_foldable, formulation_options
from .feed_trial import FEED_STEPS, confirm_feeding, worth_timing
from .reader_trial import confirm_workers
from .ranking import NOT_REACHED, against, is_switch, judging_order
from .rescue import PartJudge, keeps_rescue, with_winner, without_failed_parts
from .significance import Comparison
from .stages import run_in_stages
from .tolerances import THREADS_TOL, parity_tolerance
from .trajectory import CHAOS_FACTOR, ChaosFloors, judge_trajectory, worst_rel_diff
from .trials import MIN_MEASURED as MIN_STEPS, Budget, Trial, TrialRunner
from .tune_budget import COMPILE_MAX_SECONDS, DEFAULT_BUDGET_FRACTION, DEFAULT_MAX_SECONDS
from .tune_cache import cache_key, load_choice, save_choice
from .tune_report import TuneReport
from .tune_start import BatchStream, TuneStops

__all__ = ["tune", "read_batches", "parity_tolerance", "THREADS_TOL", "DEFAULT_MAX_SECONDS",
           "DEFAULT_BUDGET_FRACTION"]

PARITY_STEPS = 3        # steps of the engine's check_parity for a winner


def read_batches(problem: Problem, hp: HParams, count: int, device: torch.device
                 ) -> tuple[list[Batch], float]:
    """The first ``count`` training batches (on ``device``) and the median seconds per batch."""
    stream = BatchStream(problem, hp, device)
    try:
        batches = stream.take(count)
    finally:
        stream.close()
    if not batches:
        raise ValueError(f"problem {problem.name!r} produced no training batches")
    return batches, stream.seconds_per_batch()


def _engine_backends(model: nn.Module) -> tuple[str, ...]:
    """Capture backends the engine provides for ``model`` (a step of several phases: inductor, which
    compiles its networks one by one; the graph backend runs it eagerly:
    :func:`hotloop.engine.build.make_backend`)."""
    return ("inductor",) if len(model_phases(model) or ()) > 1 else ("graph", "inductor")


def _record_compiles(key: dict, trials: Sequence[Trial]) -> None:
    """Remember each compiling trial's first call, so the next tune of this key prices it."""
    for trial in trials:
        stats = getattr(getattr(getattr(trial.runner, "step", None), "backend", None), "compile_stats", None)
        if stats is not None:
            record_compile(key, trial.strategy.backend, stats)


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _calibrate(runner: TrialRunner, baseline: Trial, model: nn.Module, budget_for: Callable[[float], float],
               elapsed: Callable[[], float]) -> ModelFacts:
    """Eager fp32 after its first step: a step that counts FLOPs and ops, then up to MIN_STEPS timed
    steps, each only while its estimated seconds fit the budget that eager's speed implies.

    Calibration stops after the first timed step once it has used 30% of that budget (a very
    slow eager must not eat it all); the counting step runs on one thread (untimed, cheap on
    busy cores) and only when the first step times the thread count still fits.
    """
    facts = analyze_model(model)
    first = baseline.warmup_times[0]

    def estimate() -> float:       # the counting step's time is no estimate of a plain step
        return baseline.median if baseline.step_times else first

    def fits(seconds: float) -> bool:
        return seconds <= budget_for(estimate()) - elapsed()

    threads = torch.get_num_threads()
    if baseline.status == "ok" and fits(first * threads):
        baseline.warmup = 2
        torch.set_num_threads(1)
        try:
            with counting(network_types(model)) as counts:
                runner.step(baseline)
        finally:
            torch.set_num_threads(threads)
        facts = facts.with_counts(counts)
    while len(baseline.step_times) < MIN_STEPS and baseline.status == "ok" and fits(estimate()):
        runner.step(baseline)
        if baseline.step_times and elapsed() > 0.3 * budget_for(baseline.median):
            break
    return facts


def _engine_parity(pristine: nn.Module, hp: HParams, batches: Sequence[Batch], trial: Trial,
                   device: torch.device, floor: Callable[[int], float]) -> tuple[bool, str]:
    """check_parity over PARITY_STEPS; losses that miss a non-zero tolerance may still pass within
    CHAOS_FACTOR x the chaos floor over the same steps (the update check is never loosened)."""
    import copy
    accum = max(1, hp.accum_steps)
    steps = [list(batches[(i * accum + j) % len(batches)] for j in range(accum)) for i in range(PARITY_STEPS)]

    def build() -> ParityCase:
        model = copy.deepcopy(pristine).train()
        if trial.strategy.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return ParityCase(model, hp, steps, max_grad_norm=hp.max_grad_norm,
                          state=initial_state_for(model, batches[0], device))

    tol = parity_tolerance(trial.strategy, REFERENCE, device, hp.optimizer)
    with applied_strategy(trial.strategy, device):
        result = check_parity(build, trial.strategy, steps=PARITY_STEPS, tol=tol)
    update = "" if result.update is None else (f", update size {result.update.scale:.2f}"
                                               f" cos {result.update.cosine:.2f}")
    if result.stream_noise is not None:    # the random-stream rule has its own noise floor
        return result.ok, f"{'' if result.ok else 'REJECTED by '}check_parity ({result.stream_line()})"
    if result.ok:
        return True, f"check_parity ok (max diff {result.max_abs_diff:.1e}{update})"
    update_ok = result.update is not None and result.update.within(result.update_tol)
    if tol > 0 and update_ok:
        worst = worst_rel_diff(result.losses, result.losses_ref)
        measured = floor(PARITY_STEPS)
        if worst <= CHAOS_FACTOR * measured:
            return True, (f"check_parity ok (loss rel diff {worst:.1e} <= {CHAOS_FACTOR:g} x chaos floor "
                          f"{measured:.1e}{update})")
    return False, f"REJECTED by check_parity ({result.reason()})"


def _choose(trials: list[Trial], baseline: Trial, runner: TrialRunner, min_gain: float,
            floors: ChaosFloors) -> Trial:
    """The first candidate, in :func:`~hotloop.tools.ranking.judging_order`, that is significantly
    faster than eager (see :mod:`hotloop.tools.significance`) and passes both parity checks; else eager.

    Judging goes fastest first (a wider candidate within noise of a faster one before it) and
    stops at the first that passes: a later candidate never costs a chaos floor or a parity check."""
    baseline.parity = "reference"
    faster: list[tuple[Comparison, Trial]] = []
    for t in trials:
        if not t.measured or t is baseline:
            continue
        comparison = against(t, baseline)
        t.comparison = comparison.describe()
        if is_switch(t, comparison, min_gain):
            faster.append((comparison, t))
            t.parity = NOT_REACHED
        elif changes_random_stream(t.strategy):
            t.parity = "not judged: not faster (other random stream)"
        else:   # not a switch on time: the plain tolerance is reported, no floor is measured
            tol = parity_tolerance(t.strategy, baseline.strategy, runner.device, runner.hp.optimizer)
            t.parity = judge_trajectory(t, baseline, tol, None)[1]
    for t in judging_order(faster, baseline.strategy):
        if _passes(t, baseline, runner, floors):
            return t
    return baseline


def _passes(t: Trial, baseline: Trial, runner: TrialRunner, floors: ChaosFloors) -> bool:
    """Judge ``t``'s parity with eager: its trial trajectory (within the chaos floor), then check_parity."""
    tol = parity_tolerance(t.strategy, baseline.strategy, runner.device, runner.hp.optimizer)
    if changes_random_stream(t.strategy):   # other draws: only check_parity's rule can judge it
        ok, t.parity = True, "trajectory not compared (other random stream)"
    else:
        ok, t.parity = judge_trajectory(t, baseline, tol, floors.for_trial(t))
    if not ok:
        return False
    ok, verdict = _engine_parity(runner.pristine, runner.hp, runner.batches, t, runner.device, floors.for_trial(t))
    runner.step_calls += (3 if changes_random_stream(t.strategy) else 2) * PARITY_STEPS
    t.parity = f"{t.parity}; {verdict}"
    return ok


def _skipped(baseline: Trial, first: float, budget: float, hw: HardwareInfo, model: nn.Module,
             runner: TrialRunner, key: dict | None) -> TuneReport:
    """The report of a run whose one eager step does not fit its budget: the default Strategy, no cache."""
    if baseline.status != "ok":
        why = f"eager fp32 does not run ({baseline.status})"
    else:
        why = f"one eager step took {first:.2f} s, more than the whole budget of {budget:.2f} s"
    report = TuneReport(Strategy(), "default (not tuned)", "miss" if key is not None else "disabled", hw,
                        baseline.strategy, [baseline], [], analyze_model(model), None, budget,
                        step_calls=runner.step_calls)
    report.notes.append(f"tuning skipped: {why}; the default Strategy is used (choice not cached)")
    runner.release([baseline])
    return report


def tune(model: nn.Module, problem: Problem, hp: HParams, device: torch.device | str = "cpu",
         planned_steps: int | None = None, *, budget_fraction: float = DEFAULT_BUDGET_FRACTION,
         max_seconds: float = DEFAULT_MAX_SECONDS, compile_max_seconds: float = COMPILE_MAX_SECONDS,
         cache: bool = True,
         log: Callable[[str], None] = print, extra_proposals: Sequence[Proposal] = (),
         planned_seconds: float | None = None,
         num_batches: int = 16, warmup: int = 2, max_trial_steps: int = 10,
         min_gain: float = 0.02, hardware: HardwareInfo | None = None,
         allow_reduced_precision: bool = True) -> TuneReport:
    """Run the autotuner and return the full report (:func:`hotloop.compose.plan.auto_strategy`,
    the one-liner, returns ``report.strategy``).

    ``max_seconds`` caps tuning; when the planned run repays a compile (a compiling backend is
    proposed), the cap is ``max(max_seconds, compile_max_seconds)``, the planned run's share
    (``budget_fraction``) still applying, so a long run can afford to time its compile.
    ``allow_reduced_precision=False`` keeps every candidate at fp32 (no bf16/fp16 autocast, no TF32,
    no bf16 GEMM formulation: :func:`hotloop.tools.proposals.reduced_precision`), the caller's
    ``extra_proposals`` included; such a choice is cached under its own key.
    """
    device = torch.device(device)
    apply_process_settings()      # trials must not evict each other's oneDNN primitives
    # torch.optim imports torch._dynamo on first use (about a second): the run pays it
    # anyway when it builds its optimizer, so it is neither tuning time nor budget
    importlib.import_module("torch._dynamo")
    started = time.perf_counter()
    hard = Budget(max_seconds)      # its clock counts all of tuning, from the first batch read
    hw = hardware or detect_hardware(device)
    baseline_s = baseline_strategy()
    with preserved_process_state(), TuneStops() as stops:
        stream = BatchStream(problem, hp, device, check=stops.check)
        try:
            # one step's batches first: the cache key and eager's first step need no more
            batches = stream.take(max(1, hp.accum_steps))
            if not batches:
                raise ValueError(f"problem {problem.name!r} produced no training batches")
            key = cache_key(model, hp, batches[0], hw, device)
            if "," in problem.name:                     # a multi-problem run is tuned for its mix of problems
                key["problem"] = problem.name
            if not allow_reduced_precision:
                key["precision"] = "fp32 only"
            if cache:
                hit = load_choice(key, device)
                if hit is not None:
                    strategy, record = hit
                    report = TuneReport(strategy, "cached", "hit", hw, baseline_s,
                                        cached_rows=record.get("table", []))
                    report.tune_seconds = time.perf_counter() - started
                    log(f"autotune: cache hit -> {report.summary()}")
                    return report
            runner = TrialRunner(model, hp, batches, device, warmup=warmup, check=stops.check)
            baseline = Trial("eager", baseline_s, "baseline: eager fp32, per-tensor optimizer loop", warmup=1)
            runner.prepare(baseline)

            def budget_for(eager_s: float, cap: float = max_seconds) -> float:
                run_s = [s for s in (planned_steps * eager_s if planned_steps else None, planned_seconds) if s]
                return min([cap] + [budget_fraction * s for s in run_s])

            first = runner.step(baseline) if baseline.status == "ok" else float("inf")
            if baseline.status != "ok" or first > budget_for(first):
                report = _skipped(baseline, first, budget_for(first), hw, model, runner, key if cache else None)
                report.tune_seconds = time.perf_counter() - started
                log(f"autotune: {report.notes[0]}")
                return report
            batches += stream.take(num_batches * max(1, hp.accum_steps) - len(batches),
                                   keep_reading=lambda: hard.elapsed() < 0.2 * budget_for(first))
            reader_s = stream.seconds_per_batch()
        finally:
            stream.close()
        runner.batches = list(batches)
        # a multi-problem run: one warm-up step per task, so every capture happens in warm-up
        runner.warmup = max(warmup, len({k for b in batches for k in b if k.startswith("task:")}))
        facts = _calibrate(runner, baseline, model, budget_for, hard.elapsed)
        eager_s = baseline.median if baseline.measured else first
        reader = ReaderFacts(reader_s, eager_s)
        reader_share = reader.ratio * max(1, hp.accum_steps)     # one step's batches read / the step
        load = _load_average()
        planned_run_s = planned_steps * eager_s if planned_steps else planned_seconds
        compile_costs = next_compile_prices(key, facts.compiled_ops)
        proposals = propose(facts, hw, reader, base=baseline_s, available_backends=_engine_backends(model),
                            planned_seconds=planned_run_s, compile_costs=compile_costs, load=load,
                            formulations=formulation_options(model),
                            clip_foldable=clip_foldable(hp, device),
                            allow_reduced_precision=allow_reduced_precision)
        extra = [p for p in extra_proposals if allow_reduced_precision or not reduced_precision(p.apply(baseline_s))]
        proposals = extra + proposals          # the caller's own candidates first
        compiling = any(p.compile_cost > 0 for p in proposals if p.timed)
        cap = max(max_seconds, compile_max_seconds) if compiling else max_seconds
        # the planned run goes at the fastest step measured so far: its share shrinks as trials find one
        budget = Budget(budget_for(eager_s, cap), shrinks_to=lambda: budget_for(runner.fastest_step(eager_s), cap))
        budget.start = hard.start
        feed_reserve = FEED_STEPS if worth_timing(reader_share) else 0      # steps of the feeding trial
        trials = run_in_stages(runner, [p for p in proposals if p.timed], baseline, baseline_s, max_trial_steps,
                               budget, reserve_steps=2 * PARITY_STEPS + feed_reserve)
        skipped = [t.label for t in trials if t.status.startswith("skipped")]
        if skipped:
            log(f"autotune: budget {budget.seconds:.1f}s: skipped {skipped}")
        floors = ChaosFloors(runner, baseline)
        winner = _choose(trials, baseline, runner, min_gain, floors) if baseline.measured else baseline
        judge = PartJudge(     # the parts of a failed combination that judging left open (tools/rescue.py)
            passes=lambda t: _passes(t, baseline, runner, floors),
            affordable=lambda t: budget.remaining() > 2 * PARITY_STEPS * (t.median + baseline.median))
        # a failed combination less its failing parts, then with the winner on top (tools/rescue.py)
        for make_rescue in (lambda: without_failed_parts(trials, winner, baseline, min_gain, judge),
                            lambda: with_winner(trials, winner, baseline)):
            rescue = make_rescue() if baseline.measured else None
            if rescue is None:
                continue
            trials += runner.run_candidates([rescue], baseline, max_trial_steps, budget, reserve_steps=2 * PARITY_STEPS)
            chosen = _choose([rescue], baseline, runner, min_gain, floors) is rescue
            if chosen and keeps_rescue(rescue, winner, baseline):
                winner = rescue
        _record_compiles(key, trials)
        pipeline = [p for p in proposals if not p.timed]
        strategy = winner.strategy
        reader_notes = []
        for p in pipeline:
            strategy = p.apply(strategy)
        if strategy.num_workers > baseline_s.num_workers:        # workers only after a timed trial
            trial = confirm_workers(problem, hp, strategy.num_workers)
            reader_notes.append(trial.line())
            if not trial.kept:
                strategy = strategy.replace(num_workers=baseline_s.num_workers)
        feeding = confirm_feeding(winner, runner, problem, hp, strategy, budget.remaining(), reader_share)
        runner.release([baseline] + trials)
        strategy = strategy.replace(prefetch=feeding.chosen)
        reader_notes.append(feeding.line())
        report = TuneReport(strategy, winner.label, "miss" if cache else "disabled", hw, baseline_s,
                            [baseline] + trials, pipeline, facts, reader, budget.seconds,
                            step_calls=runner.step_calls)
        report.notes.append(f"load average {load:.1f} on {hw.cores} cores while tuning")
        if not allow_reduced_precision:
            report.notes.append("fp32 only: no bf16/fp16, TF32 or bf16-GEMM candidate was proposed")
        report.notes.extend(reader_notes)
        if not baseline.measured:
            report.notes.append("the budget ended before eager was measured: eager kept")
        report.tune_seconds = time.perf_counter() - started
        # A choice made without measuring eager, or with candidates skipped for lack of
        # budget (a busy machine), is used for this run only: caching it would pin it.
        decisive = baseline.measured and not skipped
        if cache and decisive:
            save_choice(key, strategy, report.rows())
        elif cache:
            report.notes.append("choice not cached: the budget ran out before every candidate was timed")
    log(report.summary())
    return report
