"""A short multimodel run learns every task; the graph backend captures once per task."""
from __future__ import annotations

import math

from mm_helpers import make_multi_trainer
from hotloop.engine import Strategy
from hotloop.train import Callback, Event


def test_every_task_loss_falls():
    trainer = make_multi_trainer(None, "hidden_size=32,filter_size=64,learning_rate=0.003,eval_examples=64,"
                                       "mixing=rates,mixing_rates=1:1:2", max_steps=120, loggers=[])
    before = {s: trainer.evaluate(s)["loss"] for s in trainer.eval_splits}
    after = {s: m["loss"] for s, m in trainer.fit().metrics.items()}
    assert set(after) == set(before) == set(trainer.eval_splits)
    for split in before:
        assert after[split] < before[split] - 0.25, (split, before[split], after[split])
    assert after["valid/image_synthetic"] < math.log(10)      # better than guessing among 10 classes


class CaptureCounts(Callback):
    """``trainer.step_fn.captures`` after every step, and the task of every step's batch."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_event(self, event, trainer, **info):
        if event is Event.STEP_END:
            self.counts.append(trainer.step_fn.captures)


def test_graph_backend_captures_once_per_task():
    counts = CaptureCounts()
    trainer = make_multi_trainer(None, max_steps=24, loggers=[], callbacks=[counts],
                                 strategy=Strategy(prefetch=0, backend="graph"))
    schedule = trainer.problem.reader("train", trainer.hp).schedule(0)   # the trainer's draws (same seed)
    order = [trainer.problem.names[t] for t in schedule]
    trainer.fit()
    assert trainer.step_fn.fallback_reason is None
    # copy and reverse batches have the same keys' shapes and dtypes but different task keys:
    # three captures, each made the first time its task is seen, none after
    first_seen = [i for i, t in enumerate(order[:24]) if t not in order[:i]]
    assert len(first_seen) == 3 and trainer.step_fn.captures == 3
    expected = [sum(1 for s in first_seen if s <= i) for i in range(24)]
    assert counts.counts == expected
