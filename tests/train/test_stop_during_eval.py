"""A stop signal during a long evaluation ends it at its next batch: the checkpoint of the last
completed step is kept and ``hotloop train`` exits with the signal's code within seconds."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import REPO
from hotloop.train.checkpoint import CheckpointManager, load_checkpoint, verify_checkpoint

pytestmark = pytest.mark.timeout(240)

PLUGIN = Path(__file__).with_name("slow_eval_plugin.py")
# 400 evaluation batches x 0.05 s: an evaluation of 20 s or more, begun after step 2
TINY = "hidden_size=8,batch_size=8,train_examples=64,eval_examples=3200,train_length=6,eval_length=6"
EXIT_WITHIN = 5.0   # seconds from the signal to the stop line (checkpoint written)
TEARDOWN = 25.0     # and then to the process's exit: the interpreter's teardown, slow on a loaded machine


def _train(out: Path, mark: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "hotloop", "train", "--import", str(PLUGIN), "--model", "slow_eval_tagger",
               "--override", TINY, "--output-dir", str(out), "--max-steps", "4", "--eval-every", "2",
               "--strategy", "default", "--loggers", "jsonl"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "SLOW_EVAL_MARK": str(mark)}
    return subprocess.Popen(command, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _read_lines(stream, lines: list[tuple[float, str]]) -> None:
    for line in stream:
        lines.append((time.monotonic(), line))


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGUSR1, 138), (signal.SIGINT, 130)])
def test_a_signal_during_evaluation_stops_it_at_the_next_batch(tmp_path, signum, code):
    out, mark = tmp_path / "run", tmp_path / "evaluating"
    proc = _train(out, mark)
    lines: list[tuple[float, str]] = []
    out_lines: list[tuple[float, str]] = []
    readers = [threading.Thread(target=_read_lines, args=(stream, into), daemon=True)
               for stream, into in ((proc.stderr, lines), (proc.stdout, out_lines))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert proc.poll() is None, "".join(line for _, line in lines)[-3000:]
        assert time.monotonic() < deadline, "the evaluation never started"
        time.sleep(0.02)
    time.sleep(0.2)                      # well inside the evaluation
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=120)
    exited = time.monotonic() - sent
    for reader in readers:
        reader.join(10)
    stderr, stdout = ("".join(line for _, line in into) for into in (lines, out_lines))
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr and "interrupted at step 2" in stderr, stderr[-3000:]
    # the checkpoint is written and the run reports its stop within seconds (then the interpreter exits)
    reported = next(t for t, line in lines if "interrupted at step 2" in line) - sent
    assert reported < EXIT_WITHIN, f"stopped {reported:.1f} s after {signal.Signals(signum).name}"
    assert exited < EXIT_WITHIN + TEARDOWN, f"exited {exited:.1f} s after {signal.Signals(signum).name}"
    assert f"{signal.Signals(signum).name}: evaluation of valid at step 2 stopped" in stdout + stderr
    manager = CheckpointManager(out / "checkpoints", writer=False)
    assert manager.steps() == [2]
    verify_checkpoint(manager.latest())
    meta = load_checkpoint(manager.latest())["meta"]
    assert meta["step"] == 2 and meta["valid_loss"] is None       # no partial evaluation recorded
    assert manager.best() is None
