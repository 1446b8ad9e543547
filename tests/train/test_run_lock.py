"""One owner per run directory: the lock of ``hotloop train`` (hotloop/train/runlock.py)."""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hotloop import cli
from hotloop.train import runlock
from hotloop.train.runlock import LOCK_NAME, RunLock, RunLockError, read_lock_record

from helpers import REPO, TINY   # the tiny default problem; --max-steps given here wins over its max_steps

pytestmark = pytest.mark.timeout(120)


def _train_args(out: Path, *extra: str) -> list[str]:
    return ["train", "--override", TINY, "--output-dir", str(out), "--strategy", "default",
            "--loggers", "jsonl", "--eval-every", "0", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _start_holder(out: Path) -> subprocess.Popen:
    """A long ``hotloop train`` on ``out``; returns once its lock record names it."""
    proc = subprocess.Popen([sys.executable, "-m", "hotloop", *_train_args(out, "--max-steps", "1000000")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while (read_lock_record(out) or {}).get("pid") != proc.pid:
        if proc.poll() is not None:
            pytest.fail(f"the holder exited early: {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.05)
    return proc


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("hotloop:")]


def _warm_up() -> None:
    """Import what ``hotloop train`` imports, so the timed refusal measures the command, not imports."""
    from hotloop.compose.build import resolve_names
    resolve_names("algorithmic_reverse", "transformer", None, TINY)


def test_second_run_is_refused_at_once_and_kill_9_leaves_nothing_stale(tmp_path, capsys):
    out = tmp_path / "run"
    _warm_up()
    holder = _start_holder(out)
    try:
        record = read_lock_record(out)
        assert record["host"] == socket.gethostname() and "hotloop train" in record["command"]
        assert record["rank"] == 0 and not record["released"] and record["started"]
        for extra in ((), ("--resume",)):       # a fresh run and a requeued --resume run
            capsys.readouterr()
            start = time.monotonic()
            code = cli.main(_train_args(out, "--max-steps", "2", *extra))
            elapsed = time.monotonic() - start
            err = capsys.readouterr().err
            lines = _error_lines(err)
            assert code == 2 and elapsed < 1.0, (code, elapsed, err)
            assert len(lines) == 1 and "Traceback" not in err, err
            assert f"in use by pid {holder.pid} on host {record['host']} since {record['started']}" in lines[0]
            assert "--wait-for-lock" in lines[0]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        start = time.monotonic()
        lock = RunLock(out, log=lambda message: pytest.fail(f"unexpected notice: {message}")).acquire()
        assert time.monotonic() - start < 0.5          # at once: no stale lock, no waiting
        lock.release()
        code = cli.main(_train_args(out, "--max-steps", "2", "--resume"))
        assert code == 0, capsys.readouterr().err
        assert read_lock_record(out)["released"] and read_lock_record(out)["pid"] == os.getpid()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_wait_for_lock_waits_for_the_holder(tmp_path):
    held = RunLock(tmp_path).acquire()
    with pytest.raises(RunLockError, match=f"in use by pid {os.getpid()}"):
        RunLock(tmp_path).acquire()
    timer = threading.Timer(0.6, held.release)
    timer.start()
    said: list[str] = []
    start = time.monotonic()
    second = RunLock(tmp_path, log=said.append).acquire(wait=20)
    assert 0.5 < time.monotonic() - start < 5
    assert len(said) == 1 and "waiting up to 20 s (--wait-for-lock)" in said[0]
    second.release()
    timer.join()
    third = RunLock(tmp_path).acquire()
    with pytest.raises(RunLockError, match="still held after waiting 0.3 s"):
        RunLock(tmp_path).acquire(wait=0.3)
    third.release()


def test_wait_for_lock_flag_is_checked(tmp_path, capsys):
    assert cli.main(_train_args(tmp_path / "r", "--max-steps", "1", "--wait-for-lock", "-1")) == 2
    assert "--wait-for-lock must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def _foreign_record(directory: Path, *, age: float, host: str = "other-node", pid: int = 4242) -> None:
    now = time.time()
    record = {"format": "hotloop-run-lock", "pid": pid, "host": host, "rank": 0, "started": "2030-01-01T00:00:00",
              "started_unix": now - age, "command": "hotloop train", "heartbeat": now - age, "released": False}
    (directory / LOCK_NAME).write_text(json.dumps(record))


def test_heartbeat_of_another_host_holds_until_stale(tmp_path):
    """NFS without cross-host locks: flock succeeds here, the other host's fresh heartbeat still holds."""
    _foreign_record(tmp_path, age=5)
    with pytest.raises(RunLockError, match=r"in use by pid 4242 on host other-node .*heartbeat is 5 s old, "
                                           r"under the 120 s stale timeout"):
        RunLock(tmp_path, stale_s=120).acquire()
    _foreign_record(tmp_path, age=500)
    said: list[str] = []
    lock = RunLock(tmp_path, stale_s=120, log=said.append).acquire()
    assert said == [f"lock: taking over {tmp_path / LOCK_NAME} from pid 4242 on host other-node since "
                    f"2030-01-01T00:00:00: its heartbeat is 500 s old (stale after 120 s)"]
    assert read_lock_record(tmp_path)["pid"] == os.getpid()
    lock.release()
    assert read_lock_record(tmp_path)["released"]


def test_heartbeat_is_refreshed_while_held(tmp_path):
    lock = RunLock(tmp_path, heartbeat_s=0.1).acquire()
    first = read_lock_record(tmp_path)["heartbeat"]
    time.sleep(0.5)
    assert read_lock_record(tmp_path)["heartbeat"] > first
    lock.release()


def test_without_flock_the_heartbeat_decides(tmp_path, monkeypatch):
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    _foreign_record(tmp_path, age=1, host=socket.gethostname(), pid=1)   # a live process of this host
    said: list[str] = []
    with pytest.raises(RunLockError, match="in use by pid 1 "):
        RunLock(tmp_path, log=said.append).acquire()
    assert len(said) == 1 and "does not support flock" in said[0]
    (tmp_path / LOCK_NAME).unlink()
    lock = RunLock(tmp_path, heartbeat_s=0.1, log=said.append).acquire()
    assert read_lock_record(tmp_path)["pid"] == os.getpid()
    lock.release()


def test_the_nproc_launcher_refuses_before_starting_workers(tmp_path, capsys):
    held = RunLock(tmp_path).acquire()
    try:
        code = cli.main(_train_args(tmp_path, "--max-steps", "1", "--nproc", "2"))
    finally:
        held.release()
    lines = _error_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and f"in use by pid {os.getpid()}" in lines[0]
