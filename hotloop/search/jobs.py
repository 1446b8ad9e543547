"""``--jobs K``: K worker processes share the study, each running its own trials.

Each worker is ``python -m hotloop search <the same flags> --search-worker I`` in its own
session (a terminal's Ctrl-C reaches only the command, which passes each signal on once, so a
worker sees exactly what the command saw: the first signal checkpoints and stops its trial, a
second stops at once). On Linux a worker also gets SIGTERM when the command dies, even by
SIGKILL (``PR_SET_PDEATHSIG``), so no worker outlives its search. A worker writes its output to
``DIR/logs/worker_I.log``; the command prints each trial's end as the study records it.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..train.interrupt import STOP_SIGNALS, exit_code_for

__all__ = ["run_workers", "WORKER_FLAG", "KILL_AFTER_SECONDS"]

WORKER_FLAG = "--search-worker"
#: after a second signal, workers still alive this many seconds later are killed
KILL_AFTER_SECONDS = 30.0
_POLL = 0.5
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None]:
    def preexec() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:      # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


def _start(argv: Sequence[str], index: int, logs: Path) -> subprocess.Popen:
    log = open(logs / f"worker_{index}.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "hotloop", "search", *argv, WORKER_FLAG, str(index)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True,
                                preexec_fn=_die_with_parent(os.getpid()) if sys.platform == "linux" else None)
    finally:
        log.close()


@contextmanager
def _passing_on(forward: Callable[[int], None]) -> Iterator[None]:
    """Every stop signal goes to ``forward`` (none raises in the command: the workers decide)."""
    previous = {s: signal.signal(s, lambda signum, frame: forward(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _report_finished(study: Any, seen: dict[int, str], log: Callable[[str], None]) -> None:
    """Print each trial whose state changed to a finished one since the last call."""
    for trial in study.get_trials(deepcopy=False):
        state = trial.state.name
        if seen.get(trial.number) == state or not trial.state.is_finished():
            continue
        seen[trial.number] = state
        value = f" {trial.value:.6g}" if trial.value is not None else ""
        steps = trial.user_attrs.get("steps", 0)
        log(f"search: trial {trial.number} {state.lower()}{value} after {steps} steps")


def run_workers(argv: Sequence[str], jobs: int, directory: Path, study: Any,
                log: Callable[[str], None] = print) -> int:
    """Run ``jobs`` workers on ``argv`` (the command's flags) until they exit; returns the exit code
    (``128 + signal`` after a stop signal, else the first failing worker's code, else 0)."""
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    seen = {t.number: t.state.name for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
    received: list[int] = []
    workers: list[subprocess.Popen] = []

    def forward(signum: int) -> None:
        received.append(signum)
        for worker in workers:
            if worker.poll() is None:
                try:
                    worker.send_signal(signum)
                except ProcessLookupError:
                    pass

    with _passing_on(forward):
        workers.extend(_start(argv, i, logs) for i in range(jobs))
        log(f"search: {jobs} worker processes share the study; their output: {logs}/worker_<i>.log")
        second_at: float | None = None
        while any(w.poll() is None for w in workers):
            _report_finished(study, seen, log)
            if len(received) > 1 and second_at is None:
                second_at = time.monotonic()
            if second_at is not None and time.monotonic() - second_at > KILL_AFTER_SECONDS:
                for worker in workers:
                    if worker.poll() is None:
                        worker.kill()
            time.sleep(_POLL)
    _report_finished(study, seen, log)
    codes = [w.returncode for w in workers]
    for i, code in enumerate(codes):
        if code not in (0, None) and not received:
            log(f"search: worker {i} exited with {code}: {_last_line(logs / f'worker_{i}.log')}")
    if received:
        return exit_code_for(received[0])
    return next((c for c in codes if c), 0)
