"""Start N worker processes on this machine with ``torch.distributed.run`` (torchrun).

``hotloop train ... --nproc N`` calls :func:`launch` with ``-m hotloop train
...`` (without ``--nproc``): the elastic agent runs in this process, the
workers rendezvous on the loopback address (``127.0.0.1``, a free port) and
each builds its :class:`~hotloop.parallel.ProcessGroupContext` from RANK /
WORLD_SIZE / LOCAL_RANK. When a worker dies or raises, the agent stops the
others at once and :func:`launch` raises :class:`WorkerFailedError` naming
the first failed rank and its error; with ``max_restarts`` the agent restarts
the whole group instead (the workers should then ``--resume``).

Several nodes: each node runs :func:`launch` with the same :class:`~hotloop.parallel.nodes.NodeSpec`
(``hotloop train --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --rdzv-id ID``); the agents
meet in torchrun's c10d rendezvous, hosted by node rank 0. Each rendezvous round gets a fresh
worker store on global rank 0 (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), so a node that
rejoins after a failure (restart count 0) meets survivors (restart count 1) on the same keys.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from .errors import LaunchError, WorkerFailedError
from .group import TIMEOUT_ENV
from .nodes import NODE_FLAGS, NodeSpec

__all__ = ["launch", "worker_entry", "strip_launch_flags", "describe_failure", "LAUNCH_FLAGS",
           "die_with_launcher", "LAUNCHER_PID_ENV", "ELASTIC_ENV"]

#: set by :func:`launch` for its workers: the pid whose death ends them (:func:`die_with_launcher`)
LAUNCHER_PID_ENV = "HOTLOOP_LAUNCHER_PID"
#: set to 1 for the workers of a multi-node job with restarts: every attempt resumes when it can
ELASTIC_ENV = "HOTLOOP_ELASTIC"
_PR_SET_PDEATHSIG = 1

F = TypeVar("F", bound=Callable[..., Any])

# consumed by the launcher, not passed to workers
LAUNCH_FLAGS = ("--nproc", "--max-restarts", "--dist-timeout", *NODE_FLAGS)


def worker_entry(fn: F) -> F:
    """Decorate a worker's main so an uncaught exception reaches the launcher with its traceback."""
    from torch.distributed.elastic.multiprocessing.errors import record
    return record(fn)


def die_with_launcher() -> None:
    """In a worker that :func:`launch` started: be killed (SIGKILL) when the launcher dies.

    The elastic agent stops its workers on SIGTERM or a failure, but a launcher killed with
    SIGKILL (or by the OOM killer) cannot: Linux's parent-death signal ends the workers
    then, so none is left orphaned holding the cores. A worker whose launcher is already
    gone exits at once. Elsewhere (no launcher pid, not Linux) this does nothing.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if not launcher.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):          # the launcher died before the signal was armed
        os._exit(1)


def strip_launch_flags(argv: Sequence[str], flags: Sequence[str] = LAUNCH_FLAGS) -> list[str]:
    """``argv`` without ``--flag VALUE`` / ``--flag=VALUE`` for each launcher flag."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _stderr_tail(log_dir: Path | None, local_rank: int) -> str:
    """The last meaningful stderr line of ``local_rank`` in its latest attempt ('' if none)."""
    if log_dir is None:
        return ""
    files = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stderr.log"),
                   key=lambda p: int(re.sub(r"\D", "", p.parent.parent.name) or 0))
    if not files:
        return ""
    lines = [line.strip() for line in files[-1].read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line and not line.startswith(("W1", "I1", "E1"))]
    return re.sub(r"^(\[rank\d+\]:\s*)?(hotloop: error:\s*)?", "", lines[-1]) if lines else ""


def _message(failure: Any, log_dir: Path | None = None) -> str:
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", "") or ""
    msg = str(msg).strip()
    if not msg or "To enable traceback" in msg:   # the worker wrote no error file: use its stderr
        msg = _stderr_tail(log_dir, failure.local_rank) or "no error message (see the worker's output)"
    if failure.exitcode < 0 and "Signal" not in msg:
        msg = f"killed by signal {-failure.exitcode} ({failure.signal_name()}); {msg}"
    return msg


# Errors a healthy rank reports because a peer died (not a root cause).
_SECONDARY = ("Connection closed by peer", "Connection reset by peer", "SIGTERM", "Broken pipe")


def _is_secondary(failure: Any, log_dir: Path | None = None) -> bool:
    return failure.exitcode == -15 or any(s in _message(failure, log_dir) for s in _SECONDARY)


def describe_failure(error: Any, log_dir: Path | None = None) -> tuple[str, list[int], int]:
    """(message, failed ranks, exit code) from a torchrun ``ChildFailedError``.

    The root cause is a rank's own error, not a peer's "connection reset" or the
    launcher's SIGTERM that follow it; among those, the earliest (error files and
    signal deaths are stamped at 1 s resolution, so order alone cannot decide).
    """
    rank, first = min(error.failures.items(),
                      key=lambda item: (_is_secondary(item[1], log_dir), item[1].timestamp, item[0]))
    lines = [f"distributed job failed: rank {rank} (local rank {first.local_rank}, pid {first.pid}) "
             f"exited with code {first.exitcode}: {_message(first, log_dir)}"]
    for other, failure in sorted(error.failures.items()):
        if other != rank:
            lines.append(f"  also failed: rank {other} (exit code {failure.exitcode}): "
                         f"{_message(failure, log_dir)}")
    code = first.exitcode if first.exitcode > 0 else 1
    return "\n".join(lines), sorted(error.failures), code


def _rendezvous_args(nodes: NodeSpec | None, rdzv_endpoint: str) -> tuple[list[str], dict[str, str]]:
    """torchrun's rendezvous flags and the workers' extra environment for one node or several."""
    if nodes is None:
        return ["--nnodes", "1", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", uuid.uuid4().hex], {}
    args = ["--nnodes", nodes.nnodes_arg, "--rdzv-endpoint", nodes.endpoint, "--rdzv-id", nodes.run_id,
            "--rdzv-conf", f"is_host={int(nodes.node_rank == 0)}"]
    if nodes.loopback:
        args += ["--local-addr", "127.0.0.1"]
    return args, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def launch(nproc: int, command: Sequence[str], *, module: bool = True, max_restarts: int = 0,
           rdzv_endpoint: str = "127.0.0.1:0", monitor_interval_s: float = 0.1,
           env: dict[str, str] | None = None, nodes: NodeSpec | None = None,
           dist_timeout_s: float | None = None) -> None:
    """Run ``python -m command...`` (``module=True``) or ``python command...`` in ``nproc`` processes.

    ``nodes``: this node's part of a multi-node job (``nproc`` processes here). ``dist_timeout_s``:
    the workers' collective timeout (``HOTLOOP_DIST_TIMEOUT_S``). Returns when every worker exits
    0; raises :class:`WorkerFailedError` otherwise.
    """
    if nproc < 1:
        raise LaunchError(f"--nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise LaunchError(f"--max-restarts must be >= 0, got {max_restarts}")
    if not command:
        raise LaunchError("nothing to launch")
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if dist_timeout_s is not None and not dist_timeout_s > 0:
        raise LaunchError(f"--dist-timeout must be > 0 seconds, got {dist_timeout_s:g}")
    rendezvous, worker_env = _rendezvous_args(nodes, rdzv_endpoint)
    if dist_timeout_s is not None:
        worker_env[TIMEOUT_ENV] = f"{dist_timeout_s:g}"
    if nodes is not None and max_restarts > 0:
        worker_env[ELASTIC_ENV] = "1"
    log_dir = Path(tempfile.mkdtemp(prefix="hotloop-launch-"))   # per-rank stdout/stderr copies
    argv = [*rendezvous, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--log-dir", str(log_dir), "--tee", "2",
            "--max-restarts", str(max_restarts), "--monitor-interval", str(monitor_interval_s)]
    argv += ["-m", *command] if module else list(command)
    saved = dict(os.environ)
    os.environ.update(env or {})
    os.environ.update(worker_env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # torchrun's default, without its warning
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the agent runs here: workers die with it
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as exc:
        message, ranks, code = describe_failure(exc, log_dir)
        raise WorkerFailedError(message, ranks, code) from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(log_dir, ignore_errors=True)
