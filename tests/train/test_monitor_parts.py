"""The monitor's parts without a run: BestPerSplit in max mode, the stop agreement inside an evaluation."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hotloop.train.best_per_split import MEAN, BestPerSplit
from hotloop.train.events import Event
from hotloop.train.monitor import Monitor, MonitorError, is_better
from hotloop.train.stopping import StopControl


def test_best_per_split_keeps_the_highest_in_max_mode():
    best = BestPerSplit(["valid/a", "valid/b"], monitor="accuracy", mode="max")
    trainer = SimpleNamespace(step=0, checkpoints=None, dist=SimpleNamespace(is_main=True))
    for step, (a, b) in enumerate([(0.2, 0.9), (0.5, 0.1), (0.4, 0.8)], start=1):
        trainer.step = step
        best.on_event(Event.EVAL_END, trainer, split="valid/a", metrics={"accuracy": a})
        best.on_event(Event.EVAL_END, trainer, split="valid/b", metrics={"accuracy": b})
    assert {name: entry["step"] for name, entry in best.best.items()} == {"a": 2, "b": 1, MEAN: 3}
    assert best.best["a"] == {"split": "valid/a", "step": 2, "monitor": "accuracy", "value": 0.5,
                              "file": "best-a.ckpt"}


def test_best_per_split_checks_a_named_monitor_at_start():
    trainer = SimpleNamespace(metric_names=lambda split: ["loss", "accuracy"])
    BestPerSplit(["valid/a"]).on_event(Event.FIT_START, trainer)          # default loss: not checked
    with pytest.raises(MonitorError, match="'f1'.*has: accuracy, loss"):
        BestPerSplit(["valid/a"], monitor="f1").on_event(Event.FIT_START, trainer)


def test_monitor_scores_and_improvements():
    assert Monitor("f1", "max").score(0.8) == -0.8 and Monitor().score(0.8) == 0.8
    assert Monitor().score(float("nan")) is None and not Monitor().explicit
    assert is_better(0.5, 0.7, "min") and not is_better(0.65, 0.7, "min", min_delta=0.1)
    assert is_better(0.9, 0.7, "max") and not is_better(float("nan"), None, "max")
    with pytest.raises(MonitorError, match="'min' or 'max'"):
        Monitor("loss", "maximum")


class TwoRanks:
    """A data-parallel context whose other rank has (or has not) received a signal."""

    world_size, rank, is_main = 2, 0, True

    def __init__(self, other_signalled: bool) -> None:
        self.other, self.calls = other_signalled, 0

    def all_reduce_stats(self, stats):
        self.calls += 1
        return {"signal": stats["signal"] + float(self.other), "signum": stats["signum"] + 15.0 * self.other,
                "time_up": stats["time_up"]}


def test_ranks_agree_to_leave_an_evaluation_only_at_sync_points():
    dist = TwoRanks(other_signalled=True)
    stop = StopControl(dist)
    assert not stop.signalled(sync_point=False) and dist.calls == 0      # between sync points: no collective
    assert stop.signalled(sync_point=True) and dist.calls == 1          # the other rank's SIGTERM counts
    assert stop.signum == 15 and stop.signalled(sync_point=False)
    # after the agreement every rank stops at once, without another collective
    assert stop.reason(step=3, epoch=0, max_steps=10, max_epochs=0, sync_point=False) == "interrupted"
    assert dist.calls == 1
    quiet = StopControl(TwoRanks(other_signalled=False))
    assert not quiet.signalled(sync_point=True) and quiet.signum is None


def test_one_process_leaves_at_the_next_batch():
    stop = StopControl(SimpleNamespace(world_size=1))
    assert not stop.signalled(sync_point=False)
    stop.on_signal(15)
    assert stop.signalled(sync_point=False)
