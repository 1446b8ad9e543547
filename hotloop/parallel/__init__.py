"""Data parallel over ``torch.distributed`` (gloo on CPU, NCCL on GPU), launched by ``torchrun``.

See docs/parallel.md. ``ProcessGroupContext`` implements the Trainer's ``dist=`` hook;
``launch`` re-runs a command under ``torch.distributed.run``.
"""
from .context import ProcessGroupContext
from .errors import (LaunchError, ParallelError, ShardedStateError, ShardingError,
                     WorkerFailedError)
from .group import DistEnv, init_process_group, is_distributed_env, read_env
from .launch import launch, worker_entry
from .zero import optimizer_state_bytes
from .sharding import ShardedReader, shard_rows

__all__ = ["ProcessGroupContext", "LaunchError", "ParallelError", "ShardedStateError",
           "ShardingError", "WorkerFailedError", "DistEnv", "init_process_group",
           "is_distributed_env", "read_env", "launch", "worker_entry", "optimizer_state_bytes", "ShardedReader", "shard_rows"]
