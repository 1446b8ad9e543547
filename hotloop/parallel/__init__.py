"""Data parallel over ``torch.distributed`` (gloo on CPU, NCCL on GPU), launched by ``torchrun``.

See docs/parallel.md. ``ProcessGroupContext`` implements the Trainer's ``dist=`` hook;
``launch`` re-runs a command under ``torch.distributed.run``.

``ProcessGroupContext``, ``optimizer_state_bytes``, ``ShardedReader`` and ``shard_rows`` are imported
on first use: their modules import FSDP and DTensor, which the CLI does not need to read its launch
flags from this package, nor a single-process run.
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import (LaunchError, ParallelError, ShardedStateError, ShardingError,
                     WorkerFailedError)
from .group import DistEnv, init_process_group, is_distributed_env, read_env
from .launch import launch, worker_entry

#: the names imported on first use, and the submodule that defines each
_LAZY = {"ProcessGroupContext": "context", "optimizer_state_bytes": "zero",
         "ShardedReader": "sharding", "shard_rows": "sharding"}

__all__ = ["ProcessGroupContext", "LaunchError", "ParallelError", "ShardedStateError",
           "ShardingError", "WorkerFailedError", "DistEnv", "init_process_group",
           "is_distributed_env", "read_env", "launch", "worker_entry", "optimizer_state_bytes", "ShardedReader",
           "shard_rows"]


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
