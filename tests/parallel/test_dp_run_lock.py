"""``hotloop train --nproc 2``: only global rank 0 holds the run directory's lock; a second launch is refused.

The second launch is refused twice over: by the launcher's early check (it names
``--output-dir``), and, when the directory comes from ``--config``, by rank 0's
own lock inside the workers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotloop import cli
from hotloop.train.runlock import LOCK_NAME, read_lock_record

REPO = Path(__file__).resolve().parents[2]
TINY = "batch_size=8,train_examples=64,eval_examples=16,hidden_size=16,filter_size=32,num_layers=1,num_heads=2"


def _args(out: Path | None, *extra: str) -> list[str]:
    where = ["--output-dir", str(out)] if out is not None else []
    return ["train", "--nproc", "2", "--override", TINY, "--strategy", "default", "--loggers", "jsonl",
            "--strategy-override", "data_parallel=reduce,prefetch=0", "--eval-every", "0", *where, *extra]


def _rank(pid: int) -> str | None:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
    return env.get(b"RANK", b"").decode() or None


def _flock_holders(path: Path) -> set[int]:
    """pids holding a FLOCK on ``path`` (from /proc/locks)."""
    st = path.stat()
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields:   # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            holders.add(int(fields[4]))
    return holders


@pytest.mark.timeout(200)
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the lock holders from /proc")
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"        # a zombie has exited
    except OSError:
        return False


def test_only_rank_0_locks_and_a_second_launch_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    job = subprocess.Popen([sys.executable, "-m", "hotloop", *_args(out, "--max-steps", "1000000")],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    holder = None
    try:
        deadline = time.monotonic() + 150
        while not (read_lock_record(out) or {}).get("pid"):
            assert job.poll() is None, job.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no rank took the lock"
            time.sleep(0.1)
        holder = read_lock_record(out)["pid"]
        assert holder != job.pid and _rank(holder) == "0"                     # a worker: global rank 0
        assert _flock_holders(out / LOCK_NAME) == {holder}                    # and no other process

        start = time.monotonic()
        assert cli.main(_args(out, "--max-steps", "2", "--resume")) == 2      # the launcher's check
        assert time.monotonic() - start < 2.0
        lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("hotloop:")]
        assert len(lines) == 1 and f"in use by pid {holder} on host" in lines[0], lines

        config = tmp_path / "run.json"                                        # rank 0's own lock
        config.write_text(json.dumps({"output_dir": str(out)}))
        second = subprocess.run([sys.executable, "-m", "hotloop", *_args(None, "--config", str(config),
                                                                         "--max-steps", "2", "--resume")],
                                env=env, capture_output=True, text=True, timeout=150)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "rank 0" in second.stderr and f"in use by pid {holder} on host" in second.stderr
        assert job.poll() is None                                             # the first job trains on
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    # the launcher was killed with SIGKILL: its workers die with it (no orphan keeps training)
    deadline = time.monotonic() + 10
    while holder is not None and _alive(holder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert holder is None or not _alive(holder), f"worker {holder} outlived its killed launcher"
