"""Strategy fields that reach the input pipeline change what the Trainer does."""
from __future__ import annotations

import torch

from helpers import make_trainer, params_of, tiny_hp
from hotloop.data.speedtest import SpeedTestFeeder
from hotloop.engine import Strategy
from hotloop.registry import problems
from hotloop.tools import reader_trial
from hotloop.train import Callback, Event


class _PoolProbe(Callback):
    def __init__(self) -> None:
        self.pids: list[int] = []

    def on_event(self, event, trainer, **data) -> None:
        if event is Event.STEP_END and not self.pids:
            pool = getattr(trainer.train_reader, "_pool", None)
            self.pids = list(pool.pids) if pool is not None else []


def test_num_workers_reach_the_reader_and_leave_the_batches_unchanged():
    probe = _PoolProbe()
    with_workers = make_trainer(None, max_steps=3, strategy=Strategy(prefetch=0, num_workers=2), callbacks=[probe])
    with_workers.fit()
    with_workers.train_reader.close()
    plain = make_trainer(None, max_steps=3, strategy=Strategy(prefetch=0))
    plain.fit()
    assert len(probe.pids) == 2                                   # two worker processes made the batches
    for key, value in params_of(plain).items():
        assert torch.equal(value, params_of(with_workers)[key]), key


def test_speed_test_serves_prepared_batches():
    fast = make_trainer(None, max_steps=3, strategy=Strategy(prefetch=0, speed_test=True))
    assert isinstance(fast.feeder._get_source(), SpeedTestFeeder)
    fast.fit()
    plain = make_trainer(None, max_steps=3, strategy=Strategy(prefetch=0))
    assert not isinstance(plain.feeder._get_source(), SpeedTestFeeder)


def test_workers_are_kept_only_when_the_reader_trial_shows_them_faster(monkeypatch):
    problem, hp = problems.get("algorithmic_reverse")(), tiny_hp()
    assert reader_trial.time_reader(problem, hp, 0, 3) > 0
    times = {0: 0.010, 2: 0.004}
    monkeypatch.setattr(reader_trial, "time_reader", lambda p, h, workers, n: times[workers])
    assert reader_trial.confirm_workers(problem, hp, 2).kept
    times[2] = 0.0099                                                   # within min_gain: not kept
    assert not reader_trial.confirm_workers(problem, hp, 2).kept
