"""Exceptions raised by :mod:`hotloop.parallel` (each names its cause)."""
from __future__ import annotations

from ..errors import UserError

__all__ = ["ParallelError", "LaunchError", "WorkerFailedError", "ShardedStateError", "ShardingError"]


class ParallelError(UserError, RuntimeError):
    """Base class of data-parallel errors."""


class LaunchError(ParallelError):
    """The distributed environment is missing or inconsistent (env vars, backend, nproc)."""


class WorkerFailedError(ParallelError):
    """A rank died or raised; the message names the rank, its exit code and its error."""

    def __init__(self, message: str, ranks: list[int], exit_code: int = 1) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.exit_code = exit_code


class ShardedStateError(ParallelError):
    """A sharded (Reduce-mode) optimizer state that is incomplete or does not match the model."""


class ShardingError(ParallelError):
    """A reader that cannot be split over ranks as requested."""
