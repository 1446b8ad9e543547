"""The data-parallel hook: what the Trainer needs from a process group.

:class:`LocalContext` is the single-process implementation (every method is
an identity or a no-op). ``hotloop.parallel`` provides a context with the
same interface over ``torch.distributed``; only ``is_main`` logs and writes
checkpoints.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Protocol

import torch
from torch import Tensor, nn

__all__ = ["DistContext", "LocalContext", "NoSyncFn"]

NoSyncFn = Callable[[], contextlib.AbstractContextManager]


class DistContext(Protocol):
    """Interface of a data-parallel context (see :class:`LocalContext`)."""

    rank: int
    world_size: int
    is_main: bool

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[nn.Module, torch.optim.Optimizer, NoSyncFn | None]: ...
    def shard_reader(self, reader: Any) -> Any: ...
    def all_reduce_stats(self, stats: dict[str, Tensor]) -> dict[str, Tensor]: ...
    def barrier(self) -> None: ...
    def broadcast_text(self, text: str | None) -> str: ...
    def consolidate_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...


class LocalContext:
    """One process, no communication."""

    rank = 0
    world_size = 1
    is_main = True

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[nn.Module, torch.optim.Optimizer, NoSyncFn | None]:
        """Return the (possibly wrapped) training model, optimizer and a ``no_sync`` factory."""
        return model, optimizer, None

    def shard_reader(self, reader: Any) -> Any:
        """Return the part of ``reader`` this rank reads (all of it)."""
        return reader

    def all_reduce_stats(self, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        """Sum summable statistics over ranks (identity here)."""
        return stats

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for)."""

    def broadcast_text(self, text: str | None) -> str:
        """The main rank's ``text`` on every rank (this one)."""
        return text or ""

    def consolidate_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The full optimizer ``state_dict`` on the main rank (sharded optimizers gather here)."""
        return optimizer.state_dict()
