"""Process-group set-up from the ``torchrun`` environment (RANK, WORLD_SIZE, LOCAL_RANK).

Backend: NCCL when CUDA is available, gloo otherwise. Collectives time out
after ``HOTLOOP_DIST_TIMEOUT_S`` seconds (``--dist-timeout``; default 1800, long enough for a
rank-0 checkpoint write of a large model) so a hung rank turns into an error instead of a
hang; a rank that *dies* is detected sooner by ``torch.distributed.run``, which tears the
whole job down.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import LaunchError

__all__ = ["DistEnv", "read_env", "init_process_group", "default_backend", "default_timeout_s",
           "is_distributed_env", "TIMEOUT_ENV"]

TIMEOUT_ENV = "HOTLOOP_DIST_TIMEOUT_S"
_DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, as ``torchrun`` describes it."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def is_distributed_env() -> bool:
    """True inside a ``torchrun`` worker of a job with more than one process."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def read_env(*, need_master: bool = True) -> DistEnv:
    """Parse the ``torchrun`` variables; raise :class:`LaunchError` naming what is missing or wrong.

    ``need_master=False`` (a file store) makes MASTER_ADDR / MASTER_PORT optional.
    """
    needed = ("RANK", "WORLD_SIZE") + (("MASTER_ADDR", "MASTER_PORT") if need_master else ())
    missing = [k for k in needed if k not in os.environ]
    if missing:
        raise LaunchError(f"distributed environment variables {missing} are not set; start the job "
                          "with `hotloop train ... --nproc N` or `torchrun ... -m hotloop train ...`")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        port = int(os.environ.get("MASTER_PORT", "0"))
    except ValueError as exc:
        raise LaunchError(f"bad distributed environment variable: {exc}") from None
    if world < 1 or not 0 <= rank < world:
        raise LaunchError(f"RANK={rank} is not in [0, WORLD_SIZE={world})")
    return DistEnv(rank, world, local, os.environ.get("MASTER_ADDR", ""), port)


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def default_timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else _DEFAULT_TIMEOUT_S
    except ValueError:
        raise LaunchError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise LaunchError(f"{TIMEOUT_ENV} must be > 0, got {value}")
    return value


def _job_store(env: DistEnv, timeout: timedelta, store_file: str | None = None) -> dist.Store:
    """The rendezvous key-value store, with keys private to this restart attempt.

    Under torchrun on one node the agent hosts the store and keeps it across restarts, so
    without a per-attempt prefix a restarted group would read the dead group's gloo
    addresses. Otherwise (multi-node jobs, outside torchrun) global rank 0 hosts a fresh store
    for each rendezvous round, at the MASTER_ADDR:MASTER_PORT the round chose, and no prefix
    is needed (nodes that rejoined have other restart counts than the survivors), or every
    rank opens ``store_file`` (a ``FileStore``: no port to pick).
    """
    use_agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if store_file is not None:
        store: dist.Store = dist.FileStore(store_file, env.world_size)
        store.set_timeout(timeout)
    else:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=not use_agent_store and env.rank == 0, timeout=timeout)
    if not use_agent_store:
        return store
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"hotloop/attempt_{attempt}", store)


def init_process_group(backend: str | None = None, timeout_s: float | None = None, *,
                       store_file: str | None = None) -> DistEnv:
    """Join the job's default process group (idempotent); on CUDA bind this rank to its local GPU.

    ``store_file``: rendezvous through this file (every rank passes the same path, which must
    not exist before the job) instead of a TCP store on MASTER_ADDR:MASTER_PORT.
    """
    env = read_env(need_master=store_file is None)
    backend = backend or default_backend()
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise LaunchError("backend nccl needs CUDA; use gloo on CPU")
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s or default_timeout_s())
        dist.init_process_group(backend=backend, store=_job_store(env, timeout, store_file), rank=env.rank,
                                world_size=env.world_size, timeout=timeout)
    elif dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
        raise LaunchError(f"process group already initialised as rank {dist.get_rank()}/"
                          f"{dist.get_world_size()}, environment says {env.rank}/{env.world_size}")
    return env
