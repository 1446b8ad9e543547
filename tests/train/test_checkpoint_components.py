"""Checkpoints are the states of named components: one loop saves them, one restores them.

Covers the layout (``format_version`` 2), that a version-1 checkpoint (the layout before
components: counters and the Python RNG in ``meta``, the carried state under ``"state"``)
still resumes bitwise, that an unknown version is refused in one line, and each
component's own ``state_dict`` / ``load_state_dict``.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers import ListReader, StopAt, TinyStreamLM, make_trainer, params_of, tiny_hp, tiny_lm_hp
from hotloop.hparams import hparams_to_dict
from hotloop.train import Callback, CheckpointError, Event
from hotloop.train.checkpoint import CheckpointManager, encode_plain, load_checkpoint
from hotloop.train.feeding import DataFeeder
from hotloop.train.snapshot import STATE_FORMAT_VERSION, checkpoint_contents, restore_components
from hotloop.train.train_state import TrainState

pytestmark = pytest.mark.timeout(600)

#: the layout of a version-1 checkpoint, as the Trainer wrote it before components saved themselves
V1_PAYLOAD_KEYS = {"format", "version", "meta", "model", "optimizer", "reader", "rng", "state"}
V1_META_KEYS = {"callbacks", "epoch", "evaluated", "hparams", "metrics", "precision", "python_rng", "run",
                "schedule", "step", "strategy", "torch", "valid_loss"}


def v1_contents(trainer: Any, valid_loss: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, tensors)`` of ``trainer`` now, in the version-1 layout."""
    version, internal, gauss = random.getstate()
    meta = {
        "step": trainer.step, "epoch": trainer.epoch,
        "hparams": hparams_to_dict(trainer.hp), "strategy": trainer.strategy.to_dict(),
        "schedule": trainer.schedule.state_dict(), "callbacks": trainer.callbacks.state_dict(),
        "python_rng": [version, list(internal), gauss],
        "precision": trainer.precision.state_dict(),
        "run": trainer.run_info, "valid_loss": valid_loss, "metrics": trainer.last_metrics,
        "torch": torch.__version__, "evaluated": trainer.train_state.evaluated,
    }
    rng = {"torch": torch.get_rng_state(), "numpy": encode_plain(list(np.random.get_state()))}
    position = trainer.feeder.position() if trainer.feeder.consumed else None
    tensors = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
               "rng": rng, "reader": encode_plain(position), "state": trainer.state}
    return meta, tensors


class WriteV1At(Callback):
    """Right after the checkpoint of ``step`` is written, writes the same moment in the version-1 layout."""

    def __init__(self, step: int, directory: Path) -> None:
        self.step, self.manager = step, CheckpointManager(directory)

    def on_event(self, event: Event, trainer: Any, **info: Any) -> None:
        if event is Event.CHECKPOINT and trainer.step == self.step:
            meta, tensors = v1_contents(trainer, None)
            self.manager.save(trainer.step, meta, tensors)


@pytest.mark.parametrize("kind", ["transformer", "streamed_lm"])
def test_a_version_1_checkpoint_resumes_bitwise(tmp_path, kind):
    if kind == "transformer":   # dropout: the RNGs; cosine: the schedule; evals: the evaluated flag
        kwargs: dict[str, Any] = dict(hp=tiny_hp("dropout=0.1,lr_schedule=cosine"), eval_every=3)
        total, stop = 13, 5
    else:                       # the LSTM state carried mid-stream lives under "state" in version 1
        kwargs = dict(hp=tiny_lm_hp(), problem=TinyStreamLM(), model_name="lstm_lm")
        total, stop = 10, 4
    straight = make_trainer(tmp_path / "straight", max_steps=total, **kwargs)
    straight.fit()
    old = tmp_path / "v1"
    make_trainer(tmp_path / "first", max_steps=total, callbacks=[StopAt(stop), WriteV1At(stop, old)],
                 **kwargs).fit()
    path = CheckpointManager(old).latest()
    payload = load_checkpoint(path)
    assert set(payload) == V1_PAYLOAD_KEYS and set(payload["meta"]) == V1_META_KEYS

    resumed = make_trainer(tmp_path / "resumed", max_steps=total, **kwargs)
    result = resumed.fit(resume=path)
    assert result.steps == total
    a, b = params_of(straight), params_of(resumed)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    if kind == "streamed_lm":
        assert all(torch.equal(x, y) for x, y in zip(straight.state, resumed.state))


def test_a_checkpoint_of_an_unknown_format_version_is_refused_in_one_line(tmp_path):
    trainer = make_trainer(tmp_path / "run", max_steps=2)
    trainer.fit()
    path = trainer.checkpoints.latest()
    payload = load_checkpoint(path)
    assert payload["meta"]["format_version"] == STATE_FORMAT_VERSION
    payload["meta"]["format_version"] = 99
    trainer.checkpoints.save(2, payload["meta"], {k: v for k, v in payload.items()
                                                   if k not in ("format", "version", "meta")})
    fresh = make_trainer(tmp_path / "other", max_steps=4)
    with pytest.raises(CheckpointError) as info:
        fresh.load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and "format version 99" in message and str(path) in message
    assert fresh.step == 0   # nothing was loaded


def test_a_checkpoint_holds_each_component_under_its_name(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=3, eval_every=3)
    trainer.fit()
    assert list(trainer.components()) == ["model", "optimizer", "schedule", "callbacks", "precision",
                                          "reader", "train_state", "rng"]
    payload = load_checkpoint(trainer.checkpoints.latest())
    meta = payload["meta"]
    assert {"schedule", "callbacks", "precision", "format_version", "step", "epoch", "hparams"} <= set(meta)
    assert {"model", "optimizer", "reader", "train_state", "rng"} <= set(payload)
    assert payload["train_state"]["step"] == meta["step"] == 3 and payload["train_state"]["evaluated"]
    assert set(payload["rng"]) >= {"python", "numpy", "torch"}


class Counter:
    """A component of its own: what the loop saves for it, it gets back."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = int(state["value"])


def test_one_loop_saves_and_restores_any_named_component(tmp_path):
    hp = tiny_hp()
    train_state = TrainState(torch.device("cpu"), step=7, epoch=1, metrics={"valid": {"loss": 1.5}})
    train_state.last_eval_step = 7
    description = {"step": 7, "epoch": 1, "hparams": hparams_to_dict(hp)}
    meta, tensors = checkpoint_contents({"counter": Counter(41), "train_state": train_state}, description)
    manager = CheckpointManager(tmp_path)
    path = manager.save(7, meta, tensors)

    counter, restored = Counter(), TrainState(torch.device("cpu"))
    assert restore_components(path, {"counter": counter, "train_state": restored}, hp) == []
    assert counter.value == 41
    assert (restored.step, restored.epoch, restored.metrics, restored.evaluated) == (7, 1, {"valid": {"loss": 1.5}},
                                                                                     True)
    with pytest.raises(CheckpointError, match="is incomplete: no 'other' entry"):
        restore_components(path, {"other": Counter()}, hp)


def _rest(feeder: DataFeeder) -> list[int]:
    """The ids of the batches left in the feeder's epoch."""
    out = []
    while (step := feeder.next_step(1)) is not None:
        out.append(int(step[0]["inputs"]))
    return out


def test_the_feeder_saves_its_position_and_continues_the_epoch():
    batches = [{"inputs": torch.tensor(i)} for i in range(6)]
    feeder = DataFeeder(ListReader(batches), torch.device("cpu"))
    feeder.start_epoch(0)
    assert feeder.state_dict() is None                # nothing taken yet: the epoch starts afresh
    assert [int(b["inputs"]) for b in feeder.next_step(2)] == [0, 1]
    state = feeder.state_dict()
    assert _rest(feeder) == [2, 3, 4, 5]

    again = DataFeeder(ListReader(batches), torch.device("cpu"))
    again.load_state_dict(state)
    again.start_epoch(0, again.resume_position)
    assert again.resume_position is None
    assert _rest(again) == [2, 3, 4, 5]
