"""Launching with torch.distributed.run: a rank that raises, is killed by a signal or hangs
fails the job, naming the rank, and the other ranks are stopped.

This file is also the worker script (``python test_dp_launch.py --worker ...``).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--kill-rank", type=int, default=-1)     # SIGKILLs itself
    parser.add_argument("--hang-rank", type=int, default=-1)     # never joins the barriers
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch
    from hotloop.parallel import ProcessGroupContext
    from hotloop.parallel.launch import worker_entry

    @worker_entry
    def main() -> None:
        ctx = ProcessGroupContext.from_env()
        Path(args.out, f"pid_{ctx.rank}").write_text(str(os.getpid()))
        total = ctx.all_reduce_stats({"x": torch.tensor(1.0)})["x"]
        assert float(total) == ctx.world_size
        if ctx.rank == args.crash_rank:
            raise RuntimeError(f"injected failure on rank {ctx.rank}")
        if ctx.rank == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if ctx.rank == args.hang_rank:
            time.sleep(120)       # the others' barrier must time out (HOTLOOP_DIST_TIMEOUT_S)
        for _ in range(3):
            ctx.barrier()
        time.sleep(120)  # the healthy rank must be torn down by the launcher, not time out

    main()


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.timeout(60)
def test_crashing_rank_fails_the_job_naming_the_rank(tmp_path: Path, worker_env: None) -> None:
    from hotloop.parallel import WorkerFailedError
    from hotloop.parallel.launch import launch
    with pytest.raises(WorkerFailedError) as info:
        launch(2, [__file__, "--worker", "--crash-rank", "1", "--out", str(tmp_path)], module=False)
    root_cause = str(info.value).splitlines()[0]
    assert "rank 1 (" in root_cause and "injected failure on rank 1" in root_cause, str(info.value)
    assert 1 in info.value.ranks and info.value.exit_code != 0
    survivor = int((tmp_path / "pid_0").read_text())
    with pytest.raises(ProcessLookupError):  # the healthy rank was stopped, not orphaned
        os.kill(survivor, 0)


def _survivor_stopped(path: Path) -> None:
    survivor = int(path.read_text())
    with pytest.raises(ProcessLookupError):  # stopped by the launcher, not orphaned
        os.kill(survivor, 0)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_rank_killed_by_a_signal_fails_the_job_naming_rank_and_signal(tmp_path: Path,
                                                                      worker_env: None) -> None:
    from hotloop.parallel import WorkerFailedError
    from hotloop.parallel.launch import launch
    with pytest.raises(WorkerFailedError) as info:
        launch(2, [__file__, "--worker", "--kill-rank", "1", "--out", str(tmp_path)], module=False)
    root_cause = str(info.value).splitlines()[0]
    assert "rank 1 (" in root_cause and "SIGKILL" in root_cause, str(info.value)
    assert 1 in info.value.ranks and info.value.exit_code != 0
    _survivor_stopped(tmp_path / "pid_0")


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_hung_rank_times_out_and_fails_the_job(tmp_path: Path, worker_env: None) -> None:
    """Rank 1 stops answering; rank 0's barrier times out after ``--dist-timeout`` (3 s here)."""
    from hotloop.parallel import WorkerFailedError
    from hotloop.parallel.launch import launch
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        launch(2, [__file__, "--worker", "--hang-rank", "1", "--out", str(tmp_path)], module=False,
               dist_timeout_s=3)
    waited = time.monotonic() - start
    root_cause = str(info.value).splitlines()[0]
    assert "rank 0 (" in root_cause and "timed out" in root_cause.lower(), str(info.value)
    assert waited < 60           # neither the 120 s sleep nor the default 1800 s timeout: 3 s did it
    _survivor_stopped(tmp_path / "pid_1")


class _Failure:
    """The fields of torch's ``ProcessFailure`` that ``describe_failure`` reads."""

    def __init__(self, local_rank: int, exitcode: int, message: str, timestamp: int) -> None:
        self.local_rank, self.pid, self.exitcode = local_rank, 1000 + local_rank, exitcode
        self.message, self.timestamp = message, timestamp

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name


class _ChildFailed:
    def __init__(self, failures: dict[int, _Failure]) -> None:
        self.failures = failures


def test_a_peers_connection_reset_is_never_the_root_cause_even_when_stamped_earlier() -> None:
    """Rank 0's "connection reset" error file can carry an earlier second than rank 1's SIGKILL."""
    from hotloop.parallel.launch import describe_failure
    error = _ChildFailed({
        0: _Failure(0, -15, "RuntimeError: Read error: Connection reset by peer", timestamp=100),
        1: _Failure(1, -9, "Signal 9 (SIGKILL) received by PID 1001", timestamp=101)})
    message, ranks, code = describe_failure(error)
    assert message.splitlines()[0].startswith("distributed job failed: rank 1 (") and "SIGKILL" in message
    assert "also failed: rank 0" in message and ranks == [0, 1] and code == 1
    both_primary = _ChildFailed({0: _Failure(0, 1, "ValueError: a", timestamp=101),
                                 1: _Failure(1, 2, "ValueError: b", timestamp=100)})
    assert describe_failure(both_primary)[0].startswith("distributed job failed: rank 1 (")
    assert describe_failure(both_primary)[2] == 2


def test_strip_launch_flags() -> None:
    from hotloop.parallel.launch import strip_launch_flags
    argv = ["train", "--nproc", "2", "--problem", "x", "--max-restarts=3", "--steps", "5"]
    assert strip_launch_flags(argv) == ["train", "--problem", "x", "--steps", "5"]


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker_main([a for a in sys.argv[1:] if a != "--worker"])
