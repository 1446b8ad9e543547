"""Checkpoint files: atomicity under SIGKILL, safe loading, corruption, keep-last-K + best."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import make_trainer, tiny_hp
from hotloop.train.checkpoint import (CheckpointError, CheckpointManager, decode_plain, encode_plain,
                                      load_checkpoint, save_checkpoint)

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def test_save_load_round_trip(tmp_path):
    path = save_checkpoint(tmp_path / "a.ckpt", {"step": 3, "x": [1, 2.5, None]},
                           {"w": torch.arange(4.0), "nested": {"t": (torch.ones(2), 7)}})
    payload = load_checkpoint(path)
    assert payload["meta"] == {"step": 3, "x": [1, 2.5, None]}
    assert torch.equal(payload["w"], torch.arange(4.0))
    assert torch.equal(payload["nested"]["t"][0], torch.ones(2)) and payload["nested"]["t"][1] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]  # no temporary left behind


def test_numpy_state_round_trips_exactly():
    legacy = np.random.RandomState(3).get_state()  # ('MT19937', uint32[624], int, int, float)
    back = decode_plain(encode_plain(legacy))
    assert back[0] == legacy[0] and back[1].dtype == np.uint32 and np.array_equal(back[1], legacy[1])
    assert tuple(back[2:]) == tuple(legacy[2:])
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    again = decode_plain(encode_plain({"a": np.float32(1.5), "b": arr}))
    assert again["a"] == 1.5 and again["b"].dtype == np.int16 and np.array_equal(again["b"], arr)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("as_torch_save", [False, True])
def test_malicious_pickle_is_not_executed(tmp_path, as_torch_save):
    marker = tmp_path / "pwned"
    path = tmp_path / "step-00000001.ckpt"
    if as_torch_save:
        torch.save({"format": "hotloop-checkpoint", "model": _Evil(marker)}, path)
    else:
        path.write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "foreign"])
def test_corrupt_checkpoint_gives_one_clear_error(tmp_path, damage):
    path = save_checkpoint(tmp_path / "step-00000001.ckpt", {"step": 1}, {"w": torch.randn(64, 64)})
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(2000))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"weights": torch.ones(2)}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message


def test_incompatible_checkpoint_names_the_file(tmp_path):
    trainer = make_trainer(tmp_path / "a", max_steps=1)
    path = trainer.fit().last_checkpoint
    other = make_trainer(tmp_path / "b", tiny_hp("hidden_size=24,filter_size=32"), max_steps=1)
    with pytest.raises(CheckpointError, match="does not fit this model") as info:
        other.load_checkpoint(path)
    assert str(path) in str(info.value)


def test_keep_last_k_plus_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step, loss in [(1, 3.0), (2, 1.0), (3, 2.0), (4, None), (5, 1.5)]:
        manager.save(step, {"step": step}, {"w": torch.zeros(1)}, valid_loss=loss)
    assert manager.steps() == [2, 4, 5]
    assert manager.best() == manager.path_for(2) and manager.latest() == manager.path_for(5)
    reopened = CheckpointManager(tmp_path, keep_last=2)  # best survives a restart (best.json)
    assert reopened.best() == manager.path_for(2)


def test_trainer_keeps_last_and_best(out):
    result = make_trainer(out, max_steps=8, checkpoint_every=1, eval_every=4, keep_last=2).fit()
    steps = CheckpointManager(out / "checkpoints").steps()
    best = Path(result.best_checkpoint).name
    assert steps[-2:] == [7, 8] and len(steps) in (2, 3)
    assert best in {f"step-{s:08d}.ckpt" for s in steps} and best in ("step-00000004.ckpt", "step-00000008.ckpt")


_KILL_SCRIPT = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
from helpers import make_trainer
make_trainer({out!r}, max_steps=6, checkpoint_every=1).fit()
"""


@pytest.mark.timeout(120)
def test_sigkill_while_writing_leaves_previous_checkpoint_loadable(tmp_path):
    out = tmp_path / "run"
    script = _KILL_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), out=str(out))
    env = {**os.environ, "HOTLOOP_TEST_CHECKPOINT_PAUSE": "3:60"}  # pause before renaming step 3
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpts = out / "checkpoints"
    try:
        deadline = time.monotonic() + 90
        while not list(ckpts.glob(".tmp-step-00000003.ckpt-*")):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the checkpoint write never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    manager = CheckpointManager(ckpts)
    assert manager.steps() == [1, 2]
    assert load_checkpoint(manager.latest())["meta"]["step"] == 2
    resumed = make_trainer(out, max_steps=4, checkpoint_every=1).fit(resume=True)
    assert resumed.steps == 4
    assert not list(ckpts.glob(".tmp-*"))  # the stale temporary was cleaned up
