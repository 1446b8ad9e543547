"""Resume is exact: 2N straight steps == N steps, stop, resume to 2N (bitwise, CPU fp32)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers import StopAt, TinyStreamLM, make_trainer, params_of, tiny_hp, tiny_lm_hp
from hotloop.engine import Strategy
from hotloop.train import Callback, Event

pytestmark = pytest.mark.timeout(600)  # generous: shared CI machines can be very loaded



def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resume: {different}"


def _straight_vs_resumed(tmp_path, total: int, stop: int, **kwargs):
    straight = make_trainer(tmp_path / "straight", max_steps=total, **kwargs)
    straight.fit()
    first = make_trainer(tmp_path / "resumed", max_steps=total, callbacks=[StopAt(stop)], **kwargs)
    assert first.fit().steps == stop
    second = make_trainer(tmp_path / "resumed", max_steps=total, **kwargs)
    result = second.fit(resume=True)
    assert result.steps == total
    return straight, second


@pytest.mark.parametrize("prefetch", [0, 2])
def test_transformer_resume_is_bitwise(tmp_path, prefetch):
    # dropout exercises the RNG state; cosine decay + warmup the schedule; stop mid-epoch
    # (8 batches/epoch), finish in the next epoch; evals on the way.
    hp = tiny_hp("dropout=0.1,lr_schedule=cosine")
    straight, resumed = _straight_vs_resumed(tmp_path, total=13, stop=5, hp=hp, eval_every=3,
                                             strategy=Strategy(prefetch=prefetch))
    _assert_bitwise(params_of(straight), params_of(resumed))
    sa, sb = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)


def test_resume_with_accumulation_is_bitwise(tmp_path):
    hp = tiny_hp("accum_steps=3,dropout=0.1")
    straight, resumed = _straight_vs_resumed(tmp_path, total=5, stop=2, hp=hp)
    _assert_bitwise(params_of(straight), params_of(resumed))


def test_streamed_lm_resume_carries_state_bitwise(tmp_path):
    # 7 windows per epoch; stopping at 4 leaves the LSTM state mid-stream: it must be checkpointed.
    kwargs = dict(hp=tiny_lm_hp(), problem=TinyStreamLM(), model_name="lstm_lm")
    straight, resumed = _straight_vs_resumed(tmp_path, total=10, stop=4, **kwargs)
    _assert_bitwise(params_of(straight), params_of(resumed))
    for a, b in zip(straight.state, resumed.state):
        assert torch.equal(a, b)


def test_resume_without_carried_state_would_differ(tmp_path):
    """The streamed test above can fail: dropping the carried state changes the result."""
    kwargs = dict(hp=tiny_lm_hp(), problem=TinyStreamLM(), model_name="lstm_lm")
    straight = make_trainer(tmp_path / "a", max_steps=10, **kwargs)
    straight.fit()
    make_trainer(tmp_path / "b", max_steps=10, callbacks=[StopAt(4)], **kwargs).fit()
    second = make_trainer(tmp_path / "b", max_steps=10, **kwargs)
    position = second.load_checkpoint(second.checkpoints.latest())
    second.state = second.model.initial_state(4, second.device)  # forget the stream position
    second._loop(position)
    assert any(not torch.equal(a, b) for a, b in zip(params_of(straight).values(), params_of(second).values()))


class DrawsRandom(Callback):
    """Draws from the global Python, numpy and torch RNGs after every step, as user code may."""

    def __init__(self) -> None:
        self.draws: dict[int, tuple[float, float, float]] = {}

    def on_event(self, event: Event, trainer, **info) -> None:
        if event is Event.STEP_END:
            self.draws[trainer.step] = (random.random(), float(np.random.rand()), float(torch.rand(())))


def test_resume_restores_every_global_rng(tmp_path):
    """After resume the Python, numpy and torch global generators continue where they were."""
    seen = {}
    for name, stop in (("straight", None), ("resumed", 3)):
        draws = DrawsRandom()
        extra = [StopAt(stop)] if stop else []
        trainer = make_trainer(tmp_path / name, max_steps=6, callbacks=[draws, *extra])
        trainer.fit()
        if stop:
            random.seed(123)                # another state, as a new process would have
            np.random.seed(123)
            torch.manual_seed(123)
            draws = DrawsRandom()
            make_trainer(tmp_path / name, max_steps=6, callbacks=[draws]).fit(resume=True)
        seen[name] = draws.draws
    assert sorted(seen["resumed"]) == [4, 5, 6]
    for step in (4, 5, 6):
        for source, a, b in zip(("python", "numpy", "torch"), seen["straight"][step], seen["resumed"][step]):
            assert a == b, f"step {step}: the {source} RNG was not restored"
