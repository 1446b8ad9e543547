"""The feeding trial: the chosen step fed in line and through the prefetch thread, the same batches
both ways, and reading in line chosen only when it measured faster."""
from __future__ import annotations

import pytest
import torch

from hotloop.engine.strategy import Strategy
from hotloop.tools import feed_trial
from hotloop.tools.autotune import read_batches, tune
from hotloop.tools.feed_trial import FEED_STEPS, confirm_feeding, time_block
from hotloop.tools.proposals import baseline_strategy
from hotloop.tools.trials import Trial, TrialRunner

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")


def _checksums_fed(problem, hp, prefetch: int, steps: int) -> list[float]:
    seen: list[float] = []

    def step(micro):
        seen.append(float(sum(t.double().sum() for b in micro for t in b.values() if torch.is_tensor(t))))
        return torch.tensor(0.0)

    time_block(step, problem.reader("train", hp), CPU, prefetch, steps, accum=2)
    return seen


def test_a_block_feeds_the_same_batches_in_line_and_through_the_prefetch_thread(copy_problem, tiny_hp):
    in_line = _checksums_fed(copy_problem, tiny_hp, 0, 5)
    prefetched = _checksums_fed(copy_problem, tiny_hp, 2, 5)
    assert len(in_line) == 6 and in_line == prefetched          # one warm-up step and five timed
    assert len(set(in_line)) > 1                                  # the batches differ from step to step


def _built_winner(model, problem, hp) -> tuple[Trial, TrialRunner]:
    batches, _ = read_batches(problem, hp, 4, CPU)
    runner = TrialRunner(model, hp, batches, CPU, warmup=1)
    winner = Trial("eager", baseline_strategy(), "test")
    assert runner.prepare(winner)
    for _ in range(4):
        runner.step(winner)
    return winner, runner


def test_reading_in_line_is_chosen_only_when_it_measured_faster(monkeypatch, tiny_model, copy_problem, tiny_hp):
    winner, runner = _built_winner(tiny_model, copy_problem, tiny_hp)
    seconds = {0: 0.010, 2: 0.012}
    calls: list[int] = []

    def timed(step, reader, device, prefetch, steps, accum, check):
        calls.append(prefetch)
        return seconds[prefetch] * (1 + 0.002 * (len(calls) % 3))   # a little jitter: a paired bound

    monkeypatch.setattr(feed_trial, "time_block", timed)
    strategy = Strategy()
    faster_in_line = confirm_feeding(winner, runner, copy_problem, tiny_hp, strategy, 60.0, 0.1)
    assert faster_in_line.chosen == 0 and faster_in_line.comparison.paired
    assert calls[:4] == [0, 2, 2, 0]                                # the order alternates by round
    assert "reading in line chosen" in faster_in_line.line()
    seconds[0] = 0.0119                                             # in line within min_gain: prefetch stays
    assert confirm_feeding(winner, runner, copy_problem, tiny_hp, strategy, 60.0, 0.1).chosen == 2
    seconds[0] = 0.020
    assert confirm_feeding(winner, runner, copy_problem, tiny_hp, strategy, 60.0, 0.1).chosen == 2


def test_the_trial_runs_only_when_its_rounds_fit_and_prefetch_is_on(monkeypatch, tiny_model, copy_problem, tiny_hp):
    winner, runner = _built_winner(tiny_model, copy_problem, tiny_hp)
    monkeypatch.setattr(feed_trial, "time_block", lambda *a, **k: pytest.fail("timed past the budget"))
    short = confirm_feeding(winner, runner, copy_problem, tiny_hp, Strategy(), winner.median * FEED_STEPS / 2, 0.1)
    assert short.chosen == 2 and short.comparison is None and "left of the budget" in short.line()
    in_line = confirm_feeding(winner, runner, copy_problem, tiny_hp, Strategy(prefetch=0), 60.0, 0.1)
    assert in_line.chosen == 0 and "already" in in_line.why
    cheap = confirm_feeding(winner, runner, copy_problem, tiny_hp, Strategy(), 60.0, 0.01)   # 1% of the step
    assert cheap.chosen == 2 and "reading is 1.0% of the step" in cheap.line()


def test_a_failing_feed_keeps_the_prefetch_and_says_why(monkeypatch, tiny_model, copy_problem, tiny_hp):
    winner, runner = _built_winner(tiny_model, copy_problem, tiny_hp)

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(feed_trial, "time_block", broken)
    result = confirm_feeding(winner, runner, copy_problem, tiny_hp, Strategy(), 60.0, 0.1)
    assert result.chosen == 2 and "OSError: disk gone" in result.line()


def test_tune_applies_the_feeding_trials_choice(monkeypatch, tiny_model, copy_problem, tiny_hp):
    monkeypatch.setattr(feed_trial, "worth_timing", lambda share, min_gain=0.02: True)   # whatever the reader costs
    monkeypatch.setattr(feed_trial, "time_block",
                        lambda step, reader, device, prefetch, *a, **k: 0.010 if prefetch == 0 else 0.015)
    report = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=60.0, cache=False,
                  log=lambda line: None, max_trial_steps=3, num_batches=6)
    assert report.strategy.prefetch == 0
    assert any(note.startswith("feeding trial: in line / prefetch=2") for note in report.notes)
