"""A full disk while writing a checkpoint: one line naming the file, exit 2, previous checkpoint intact."""
from __future__ import annotations

import errno

import pytest
import torch

from hotloop import cli
from hotloop.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.timeout(300)

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2")

FAILURES = {
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "torch zip writer": lambda: RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                                             "4480 vs 4376"),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_full_disk_on_checkpoint_write(capsys, tmp_path, monkeypatch, kind):
    real_save = torch.save
    calls = {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 2:          # the second checkpoint (step 4) hits the full disk mid-write
            f.write(b"partial")
            raise FAILURES[kind]()
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    run_dir = tmp_path / "r"
    code = cli.main(["train", "--override", TINY, "--output-dir", str(run_dir), "--max-steps", "4",
                     "--eval-every", "2", "--strategy", "default", "--loggers", "jsonl"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line
             and "self.encoder" not in line]
    assert code == 2 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("hotloop: error: cannot write "), err
    assert str(run_dir / "checkpoints" / "step-00000004.ckpt") in lines[0]
    assert "no space left on device" in lines[0]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["best.json", "step-00000002.ckpt", "step-00000002.manifest.json"]   # no temporary
    assert load_checkpoint(run_dir / "checkpoints" / "step-00000002.ckpt")["meta"]["step"] == 2


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    from hotloop.train.checkpoint import save_checkpoint

    def save(obj, f, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path / "x.ckpt", {"step": 1}, {})
    assert info.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []
