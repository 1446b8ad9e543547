"""The tuning budget is a promise, checked on a fake clock with steps of a chosen length (no timing).

A run whose one eager step exceeds the budget is not tuned (one notice, the default Strategy);
otherwise no step of eager or of a candidate starts unless its estimate fits what is left.
"""
from __future__ import annotations

import time
import types

import pytest

from hotloop.engine import build as engine_build
from hotloop.engine.strategy import Strategy
from hotloop.tools import autotune, trials, tune_start
from hotloop.tools.autotune import tune
from hotloop.tools.proposals import baseline_strategy

pytestmark = pytest.mark.timeout(120)


class _FakeTime:
    """``time`` for the tuner's modules: ``perf_counter`` reads a clock that only steps advance."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleep = time.sleep

    def perf_counter(self) -> float:
        return self.now


class _SlowStep:
    """A built step that takes ``seconds`` on the fake clock, then runs the real step."""

    def __init__(self, inner, clock: _FakeTime, seconds: float, starts: list) -> None:
        self.inner, self.clock, self.seconds, self.starts = inner, clock, seconds, starts

    def __call__(self, micro, state):
        self.starts.append(self.clock.now)
        self.clock.now += self.seconds
        return self.inner(micro, state)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def slow_steps(monkeypatch):
    """``set(seconds)``: every trial step from now on takes that long on the fake clock."""
    clock = _FakeTime()
    for module in (autotune, trials, tune_start):
        monkeypatch.setattr(module, "time", clock)
    real = trials.build_step
    config = types.SimpleNamespace(seconds=1.0, starts=[], clock=clock)

    def build(*args, **kwargs):
        built = real(*args, **kwargs)
        built.step = _SlowStep(built.step, clock, config.seconds, config.starts)
        return built

    monkeypatch.setattr(trials, "build_step", build)
    return config


def test_an_eager_step_longer_than_the_budget_skips_tuning_with_one_notice(slow_steps, tiny_model,
                                                                            copy_problem, tiny_hp):
    slow_steps.seconds = 32.0                 # the full-size Mask R-CNN step of the report
    lines: list[str] = []
    # 4 planned steps at 4%: a budget of 5.1 s against a 32 s step
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", 4, cache=False, log=lines.append, num_batches=6)
    assert report.step_calls == 1 and len(slow_steps.starts) == 1     # the one step that measured it
    assert report.strategy == Strategy() and report.chosen == "default (not tuned)"
    assert len(lines) == 1 and "tuning skipped" in lines[0] and "32.00 s" in lines[0], lines
    assert report.tune_seconds == pytest.approx(32.0)


@pytest.mark.parametrize("planned, cap, budget", [(150, 60.0, 6.0), (None, 3.5, 3.5), (None, 2.5, 2.5)])
def test_no_step_starts_past_the_budget(slow_steps, tiny_model, copy_problem, tiny_hp, planned, cap, budget):
    """1 s steps. 150 planned steps at 4%: a 6 s budget, room for a few eager and candidate steps;
    a 3.5 s cap: eager's first, counting and one timed step leave no room for any candidate; a 2.5 s
    cap: no room for a timed eager step after the first two."""
    slow_steps.seconds = 1.0
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", planned, max_seconds=cap, cache=False,
                  log=lambda line: None, num_batches=6, max_trial_steps=3)
    assert report.budget_seconds == pytest.approx(budget)
    assert slow_steps.starts and max(slow_steps.starts) + 1.0 <= budget + 1e-9, slow_steps.starts
    assert report.tune_seconds <= budget + 1e-9
    assert any(t.status.startswith("skipped") for t in report.trials)   # the rest did not fit


def test_the_runs_share_is_priced_at_the_fastest_step_measured(slow_steps, monkeypatch, tiny_model,
                                                                copy_problem, tiny_hp):
    """Eager steps take 1 s, every candidate's 0.25 s: 1,500 planned steps at 4% give 60 s at eager's
    speed, 15 s once a candidate has measured 0.25 s steps; tuning ends within that (plus the step
    running when it shrank)."""
    def build(model, hp, strategy, *args, **kwargs):
        built = engine_build.build_step(model, hp, strategy, *args, **kwargs)
        seconds = 1.0 if strategy == baseline_strategy() else 0.25
        built.step = _SlowStep(built.step, slow_steps.clock, seconds, slow_steps.starts)
        return built

    monkeypatch.setattr(trials, "build_step", build)
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", 1500, max_seconds=1000.0, cache=False,
                  log=lambda line: None, num_batches=6, max_trial_steps=10)
    fast = [t for t in report.trials if t.label != "eager" and len(t.step_times) >= trials.MIN_MEASURED]
    assert fast and min(t.median for t in fast) == pytest.approx(0.25)
    assert report.budget_seconds == pytest.approx(15.0)
    assert report.tune_seconds <= 15.0 + 1.0
