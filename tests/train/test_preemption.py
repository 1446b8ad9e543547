"""Preemption: SIGTERM at random moments, restart with --resume, same final weights (bitwise, CPU fp32)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO

pytestmark = pytest.mark.timeout(300)

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2,dropout=0.1")
STEPS = 60


def _command(out: Path) -> list[str]:
    return [sys.executable, "-m", "hotloop", "train", "--override", TINY, "--output-dir", str(out),
            "--max-steps", str(STEPS), "--eval-every", "0", "--strategy", "default",
            "--strategy-override", "sync_every=2", "--loggers", "jsonl", "--resume"]


def _env() -> dict[str, str]:
    # one thread: the same kernels in every process, and less load on a shared machine
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _rows(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.is_file() else 0


def _final_state(out: Path) -> dict[str, torch.Tensor]:
    payload = torch.load(out / "checkpoints" / f"step-{STEPS:08d}.ckpt", weights_only=True)
    state = {f"model.{k}": v for k, v in payload["model"].items()}
    for index, entry in payload["optimizer"]["state"].items():
        state.update({f"opt.{index}.{k}": v for k, v in entry.items() if isinstance(v, torch.Tensor)})
    return state


def test_sigterm_five_times_then_resume_is_bitwise(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    reference = subprocess.Popen(_command(tmp_path / "straight"), cwd=tmp_path, env=_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "preempted"
    metrics = out / "metrics.jsonl"
    codes = []
    for _ in range(5):
        before = _rows(metrics)
        proc = subprocess.Popen(_command(out), cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while _rows(metrics) <= before and proc.poll() is None:   # wait until this run trains
            assert time.monotonic() < deadline, "no training progress"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))                           # then a random moment
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        codes.append(proc.returncode)
        assert proc.returncode == 143, f"seed {seed}: exit {proc.returncode}: {err[-2000:]}"
        assert "interrupted at step" in err and "Traceback" not in err, err[-2000:]
    final = subprocess.run(_command(out), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"done: {STEPS} steps" in final.stdout
    _, err = reference.communicate(timeout=180)
    assert reference.returncode == 0, err[-3000:]
    a, b = _final_state(tmp_path / "straight"), _final_state(out)
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"seed {seed}: interrupted run differs in {differing[:5]}"


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, capsys):
    from hotloop import cli
    out = tmp_path / "r"
    code = cli.main(["train", "--override", TINY, "--output-dir", str(out), "--max-steps", "2",
                     "--strategy", "default", "--resume"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    notices = [line for line in captured.out.splitlines() if line.startswith("resume:")]
    assert notices == [f"resume: no checkpoint in {out / 'checkpoints'} yet; starting from step 0"]
    assert (out / "checkpoints" / "step-00000002.ckpt").is_file()
