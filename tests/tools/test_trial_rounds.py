"""Interleaved trial rounds under a budget: a candidate's slow first step (capture, compilation,
kernel primitives) is a one-time cost, not the price of every later round."""
from __future__ import annotations

from helpers import FakeClock
from hotloop.engine.strategy import Strategy
from hotloop.tools.trials import MIN_MEASURED, Budget, Trial, TrialRunner


class _SimulatedRunner(TrialRunner):
    """Steps cost simulated seconds on a fake clock: ``first`` for a trial's first step, then ``steady``."""

    def __init__(self, clock: FakeClock, first: dict[str, float], steady: float) -> None:
        self.clock, self.first, self.steady = clock, first, steady
        self.warmup, self.round, self.step_calls, self.rounds_started = 2, -1, 0, 0

    def prepare(self, trial: Trial) -> bool:
        trial.status, trial.runner = "ok", object()
        return True

    def step(self, trial: Trial) -> float:
        seconds = self.first.get(trial.label, self.steady) if trial.steps_run == 0 else self.steady
        self.clock.now += seconds
        self.step_calls += 1
        self.record(trial, 1.0, seconds)      # filed as the real runner files a step
        return seconds


def test_candidates_with_slow_first_steps_are_all_measured_when_the_steady_rounds_fit() -> None:
    """Six capturing candidates (2.5 s first step, 60 ms after) and five cheap ones, 27 s: the
    first round takes about 15 s, and every later round about 0.7 s, so all of them are timed."""
    clock = FakeClock()
    capturing = [Trial(f"graph {i}", Strategy(backend="graph"), "test", compile_cost=2.0) for i in range(6)]
    cheap = [Trial(f"cheap {i}", Strategy(), "test") for i in range(5)]
    runner = _SimulatedRunner(clock, {t.label: 2.5 for t in capturing}, steady=0.06)
    reference = Trial("eager", Strategy(), "reference")
    runner.prepare(reference)
    for _ in range(4):
        runner.step(reference)
    out = runner.run_candidates(capturing + cheap, reference, 10, Budget(27.0, clock=clock), reserve_steps=6)
    assert all(t.status == "ok" for t in out), [t.status for t in out]
    assert all(len(t.step_times) >= MIN_MEASURED for t in out)
    assert clock.now <= 27.0 + 0.06 + 1e-9        # a step is never cut: at most one step past the cap


def test_rounds_stop_before_the_budget_when_steady_steps_are_slow() -> None:
    clock = FakeClock()
    slow = [Trial(f"slow {i}", Strategy(), "test") for i in range(3)]
    runner = _SimulatedRunner(clock, {}, steady=1.0)
    reference = Trial("eager", Strategy(), "reference")
    runner.prepare(reference)
    runner.step(reference)
    budget = Budget(8.0, clock=clock)
    out = runner.run_candidates(slow, reference, 10, budget)
    assert budget.elapsed() <= 8.0         # no step starts unless its estimate fits what is left
    assert [t.status.split(":")[0] for t in out] == ["ok", "skipped", "skipped"]
    assert len(out[0].step_times) == MIN_MEASURED
