"""Checkpoints that prove themselves (manifests), and a finished run that stays finished.

One uninterrupted reference run (6 steps, checkpoints at 2, 4, 6) is trained once;
each test works on a copy of its directory.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from hotloop import cli
from hotloop.train.checkpoint import CorruptCheckpointError, load_checkpoint
from hotloop.train.manifest import manifest_path, read_manifest
from hotloop.train.runlock import RunLock

pytestmark = pytest.mark.timeout(180)

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2,dropout=0.1")


def _train(out: Path, *extra: str) -> list[str]:
    return ["train", "--override", TINY, "--output-dir", str(out), "--strategy", "default",
            "--loggers", "jsonl", "--eval-every", "2", *extra]


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}.ckpt"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    assert cli.main(_train(out, "--max-steps", "6")) == 0
    return out


@pytest.fixture
def run(reference, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(reference, copy)
    return copy


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    payload = torch.load(path, weights_only=True)
    state = {f"model.{k}": v for k, v in payload["model"].items()}
    for index, entry in payload["optimizer"]["state"].items():
        state.update({f"opt.{index}.{k}": v for k, v in entry.items() if isinstance(v, torch.Tensor)})
    state["rng"] = payload["rng"]["torch"]
    return state


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
        return
    data[len(data) // 2] ^= 0x01        # a flipped bit in the tensor data: the file still loads
    path.write_bytes(bytes(data))
    if how == "flip-no-manifest":        # a checkpoint from before manifests: its zip CRCs decide
        manifest_path(path).unlink()


def test_every_checkpoint_has_a_manifest(reference):
    for step in (2, 4, 6):
        record = read_manifest(_ckpt(reference, step))
        assert record["size"] == _ckpt(reference, step).stat().st_size and record["step"] == step
        assert record["sha256"] == hashlib.sha256(_ckpt(reference, step).read_bytes()).hexdigest()


@pytest.mark.parametrize("how", ["truncate", "flip", "flip-no-manifest"])
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(reference, run, capsys, how):
    newest = _ckpt(run, 6)
    _damage(newest, how)
    capsys.readouterr()
    assert cli.main(_train(run, "--max-steps", "6", "--resume")) == 0
    out = capsys.readouterr().out
    notices = [line for line in out.splitlines() if "is damaged" in line]
    assert len(notices) == 1 and notices[0].startswith(f"checkpoint {newest} is damaged (")
    assert notices[0].endswith("moved it aside to step-00000006.ckpt.corrupt"), notices[0]
    assert (run / "checkpoints" / "step-00000006.ckpt.corrupt").is_file()      # kept, never deleted
    assert "done: 6 steps" in out
    ref, got = _tensors(_ckpt(reference, 6)), _tensors(newest)
    assert ref.keys() == got.keys()
    assert [k for k in ref if not torch.equal(ref[k], got[k])] == []         # bitwise the same run


def test_a_named_damaged_checkpoint_is_an_error_not_a_fallback(run, capsys):
    _damage(_ckpt(run, 6), "flip")
    assert cli.main(["eval", "--checkpoint", str(_ckpt(run, 6))]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hotloop:")]
    assert lines == [f"hotloop: error: checkpoint {_ckpt(run, 6)} is damaged: its sha256 does not match its manifest"]
    assert _ckpt(run, 6).is_file()                                            # not moved aside
    with pytest.raises(CorruptCheckpointError):
        load_checkpoint(_ckpt(run, 6))


def test_eval_falls_back_from_a_damaged_best_and_takes_no_lock(run, capsys):
    best = run / "checkpoints" / f"step-{6:08d}.ckpt"
    _damage(best, "truncate")
    held = RunLock(run).acquire()   # a run is training in this directory: eval neither waits nor fails
    try:
        capsys.readouterr()
        assert cli.main(["eval", "--output-dir", str(run), "--splits", "valid"]) == 0
    finally:
        held.release()
    captured = capsys.readouterr()
    notices = [line for line in captured.err.splitlines() if "is damaged" in line]
    assert len(notices) == 1 and "using the newest checkpoint that verifies instead" in notices[0]
    assert f"checkpoint {_ckpt(run, 4)}" in captured.out


def test_a_checkpoint_without_manifest_loads_with_one_notice(run, capsys):
    manifest_path(_ckpt(run, 6)).unlink()
    capsys.readouterr()
    assert cli.main(["eval", "--output-dir", str(run), "--splits", "valid"]) == 0
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if "has no manifest" in line]
    assert len(notices) == 1 and str(_ckpt(run, 6)) in notices[0]


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_a_finished_run_stays_finished(run, capsys):
    before = _snapshot(run)
    capsys.readouterr()
    assert cli.main(_train(run, "--max-steps", "6", "--resume")) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"resume: {run} already finished at step 6 (epoch 0), its --max-steps 6; nothing to do")
    assert _snapshot(run) == before                   # metrics.jsonl, checkpoints, run files: byte-identical
    assert cli.main(_train(run, "--max-steps", "8", "--resume")) == 0      # a raised limit trains on
    assert "done: 8 steps" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_bytes().startswith(before["metrics.jsonl"])


def test_a_run_finished_by_max_epochs_stays_finished(tmp_path, capsys):
    run = tmp_path / "epochs"
    assert cli.main(_train(run, "--max-epochs", "1", "--eval-every", "0")) == 0     # 8 steps: one epoch
    before = _snapshot(run)
    capsys.readouterr()
    assert cli.main(_train(run, "--max-epochs", "1", "--eval-every", "0", "--resume")) == 0
    assert "already finished at step 8 (epoch 1), its --max-epochs 1" in capsys.readouterr().out
    assert _snapshot(run) == before


def test_trainer_resume_at_an_evaluated_step_does_not_evaluate_it_again(tmp_path):
    """The Python API: a checkpoint records that its step was evaluated; resuming there adds no valid row."""
    from helpers import make_trainer
    out = tmp_path / "api"
    make_trainer(out, max_steps=4, eval_every=2).fit()
    rows = (out / "metrics.jsonl").read_text().count('"split": "valid"')
    result = make_trainer(out, max_steps=4, eval_every=2).fit(resume=True)
    assert result.steps == 4 and result.metrics["valid"]
    assert (out / "metrics.jsonl").read_text().count('"split": "valid"') == rows
