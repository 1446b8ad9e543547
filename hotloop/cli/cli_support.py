"""What the ``hotloop`` command needs for ``--nproc N``.

In the command's process: :func:`maybe_launch` re-runs ``python -m hotloop
<argv without --nproc/--max-restarts>`` in N workers under
``torch.distributed.run`` and returns the exit code. In each worker:
:func:`join_job` joins the process group (datagen and strategy planning use it),
the run's context is then made from the planned Strategy
(:meth:`ProcessGroupContext.for_strategy`), and :func:`worker_device` picks this
rank's GPU.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

from ..parallel.errors import LaunchError, WorkerFailedError
from ..parallel.group import is_distributed_env
from ..parallel.launch import ELASTIC_ENV, launch, strip_launch_flags
from ..parallel.nodes import NODE_FLAGS, NodeSpec, node_spec

__all__ = ["maybe_launch", "join_job", "join_single_process_job", "in_worker", "worker_device", "prepare_in_rank_order", "flag_value",
           "flag_text", "restart_resume", "job_nodes", "dist_timeout"]


def flag_text(argv: Sequence[str], flag: str) -> str | None:
    """The text after the first ``flag`` (``--flag V`` or ``--flag=V``) in ``argv``, else None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def flag_value(argv: Sequence[str], flag: str, default: Any, convert: Callable[[str], Any] = int,
               expects: str = "an integer") -> Any:
    """``convert`` of the text after ``flag`` (``--flag N`` or ``--flag=N``) in ``argv``, else ``default``."""
    raw = flag_text(argv, flag)
    if raw is None:
        return default
    try:
        return convert(raw)
    except ValueError:
        raise LaunchError(f"{flag} expects {expects}, got {raw!r}") from None


def job_nodes(argv: Sequence[str]) -> NodeSpec | None:
    """The multi-node part of ``argv`` (``--nnodes`` ... or a Slurm step); None on one node."""
    return node_spec({flag: flag_text(argv, flag) for flag in NODE_FLAGS})


def dist_timeout(argv: Sequence[str]) -> float | None:
    """``--dist-timeout SECONDS`` from ``argv`` (None when absent)."""
    return flag_value(argv, "--dist-timeout", None, float, "seconds")


def maybe_launch(argv: Sequence[str], stderr: Any = None) -> int | None:
    """Launch ``hotloop <argv>`` in ``--nproc`` workers (on each of ``--nnodes``) and return the exit code.

    Returns None (run in this process) for one process on one node, or inside a
    torchrun worker (the workers receive argv without the launcher flags).
    """
    stderr = stderr or sys.stderr
    try:
        nproc = flag_value(argv, "--nproc", 1)
        nodes = job_nodes(argv)
        if (nproc == 1 and nodes is None) or "TORCHELASTIC_RUN_ID" in os.environ:
            return None
        launch(nproc, ["hotloop", *strip_launch_flags(argv)],
               max_restarts=flag_value(argv, "--max-restarts", 0), nodes=nodes,
               dist_timeout_s=dist_timeout(argv))
    except LaunchError as exc:
        print(f"hotloop: error: {exc}", file=stderr)
        return 2
    except WorkerFailedError as exc:
        print(f"hotloop: error: {exc}", file=stderr)
        return exc.exit_code
    return 0


def in_worker() -> bool:
    """True inside a ``torchrun`` worker (the command then trains in this process as one rank)."""
    return is_distributed_env()


def join_job() -> Any:
    """Join the multi-process job; returns a :class:`ProcessGroupContext` (mode from the Strategy later)."""
    from ..parallel.context import ProcessGroupContext
    return ProcessGroupContext.from_env()


def join_single_process_job(request: Any) -> Any:
    """One process asked for ``data_parallel=fsdp``: a one-rank :class:`ProcessGroupContext` (FSDP needs
    a process group even at world size 1); None for any other Strategy."""
    mode = request.overrides.get("data_parallel", request.base.data_parallel)
    if mode != "fsdp":
        return None
    from ..parallel.context import ProcessGroupContext
    return ProcessGroupContext.single_process(mode)


def worker_device(device: str) -> str:
    """``cuda`` becomes ``cuda:LOCAL_RANK`` in a multi-process job; anything else is unchanged."""
    if device == "cuda" and is_distributed_env():
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device


def prepare_in_rank_order(prepare: Callable[[], Any], dist: Any) -> None:
    """Run datagen on the main rank first, then on the others (idempotent there: nothing to redo)."""
    if dist is None:
        prepare()
        return
    if dist.is_main:
        prepare()
    dist.barrier()
    if not dist.is_main:
        prepare()


def restart_resume(resume: bool, has_checkpoints: bool) -> bool:
    """``--resume`` for this worker: on a torchrun restart (attempt > 0), resume iff a checkpoint exists.

    The first attempt keeps the user's choice; a restarted group continues from
    the last checkpoint the failed attempt wrote (or starts over if it wrote none). In a
    multi-node job with restarts every attempt does so: a node that rejoins is on its
    first attempt while the survivors are on a later one, and all must agree.
    """
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 or os.environ.get(ELASTIC_ENV) == "1":
        return has_checkpoints
    return resume
