"""Feeding the training step: one epoch at a time, ``accum`` micro-batches per step.

Uses :func:`hotloop.data.prefetch` (background queue + device copy) when
``capacity > 0``, else iterates synchronously; both give the same batches.
``speed_test=True`` serves a few prepared batches repeatedly instead
(compute-only throughput, :mod:`hotloop.data.speedtest`). Time spent waiting in ``next()`` is summed in :attr:`DataFeeder.data_time`
(Python floats, no device sync) so the trainer can report the data fraction.

Position for checkpoints: ``{"epoch_start": reader state at epoch start,
"consumed": batches taken, "reader": exact state}``; the exact state is the
prefetcher's consumed position (batches produced ahead are not counted) or
the reader's own. A source without ``state_dict`` is resumed by replaying
the epoch from its start and skipping ``consumed`` batches. ``state_dict()`` is that
position as tensors and plain data (None before the first batch of an epoch);
``load_state_dict(state)`` keeps it as :attr:`DataFeeder.resume_position`, for the
caller to hand to ``start_epoch`` (which clears it).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import torch

from ..data.prefetch import prefetch as prefetch_reader
from ..data.prefetch import to_device
from ..data.speedtest import speed_test as speed_test_reader
from ..problems.base import Batch
from .checkpoint import decode_plain, encode_plain

__all__ = ["DataFeeder", "to_device"]


class DataFeeder:
    """Iterates ``reader`` epoch by epoch; ``next_step(n)`` returns up to n batches or None.

    With prefetch, one prefetcher wraps the reader for the whole run and is
    iterated once per epoch; its ``state_dict()`` is the consumed position.
    """

    def __init__(self, reader: Any, device: torch.device, prefetch: int = 0,
                 prefetch_fn: Callable[..., Any] | None = None, *, speed_test: bool = False) -> None:
        self.reader = reader
        self.device = device
        self.prefetch_fn = (prefetch_fn or prefetch_reader) if prefetch > 0 else None
        if speed_test:
            self.prefetch_fn = self._speed_test
        self.capacity = prefetch
        self.data_time = 0.0
        self.clock: Callable[[], float] = time.perf_counter  # replaceable in tests
        self.consumed = 0
        self._epoch_start: Any = None
        self._it: Iterator[Batch] | None = None
        self._source: Any = None
        self.resume_position: dict[str, Any] | None = None   # set by load_state_dict

    @staticmethod
    def _speed_test(reader: Any, capacity: int, device: torch.device) -> Any:
        return speed_test_reader(reader, device=device)

    @property
    def asynchronous(self) -> bool:
        return self.prefetch_fn is not None

    def _get_source(self) -> Any:
        if self._source is None:
            self._source = (self.prefetch_fn(self.reader, capacity=self.capacity, device=self.device)
                            if self.prefetch_fn is not None else self.reader)
        return self._source

    def start_epoch(self, epoch: int, position: dict[str, Any] | None = None) -> None:
        """Begin ``epoch``, or continue it from a checkpointed ``position``."""
        self._close_iterator()
        self.resume_position = None
        source = self._get_source()
        skip = 0
        if position is None:
            source.set_epoch(epoch)
            self._epoch_start = source.state_dict()
            self.consumed = 0
        else:
            self._epoch_start = position["epoch_start"]
            self.consumed = int(position["consumed"])
            if position.get("reader") is not None:
                source.load_state_dict(position["reader"])
            else:
                source.load_state_dict(self._epoch_start)
                skip = self.consumed
        self._it = iter(source)
        for _ in range(skip):
            if next(self._it, None) is None:
                break

    def next_step(self, n: int) -> list[Batch] | None:
        """Up to ``n`` micro-batches (fewer at the end of the epoch); None when the epoch is over."""
        assert self._it is not None, "call start_epoch() first"
        batches: list[Batch] = []
        start = self.clock()
        for _ in range(n):
            batch = next(self._it, None)
            if batch is None:
                break
            batches.append(batch if self.asynchronous else to_device(batch, self.device))
        self.data_time += self.clock() - start
        self.consumed += len(batches)
        return batches or None

    def position(self) -> dict[str, Any]:
        """Where the epoch stands (see module docstring)."""
        pos: dict[str, Any] = {"epoch_start": self._epoch_start, "consumed": self.consumed}
        source = self._get_source()
        if hasattr(source, "state_dict"):
            pos["reader"] = source.state_dict()
        return pos

    def state_dict(self) -> dict[str, Any] | None:
        """The position (tensors and plain data), or None when no batch of the epoch was taken."""
        return encode_plain(self.position()) if self.consumed else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Keep a saved position as :attr:`resume_position` (None: the epoch starts afresh)."""
        self.resume_position = decode_plain(state)

    def finish_epoch(self) -> None:
        """Mark the epoch complete (its position is no longer needed)."""
        self._close_iterator()
        self.consumed = 0

    def _close_iterator(self) -> None:
        if self._it is not None and hasattr(self._it, "close"):
            self._it.close()  # a prefetcher stops its producer and rewinds to the consumed batch
        self._it = None

    def close(self) -> None:
        """Stop background feeding and the reader's workers."""
        self._close_iterator()
        if self._source is not None and self._source is not self.reader and hasattr(self._source, "close"):
            try:
                self._source.close()
            except Exception:  # noqa: BLE001 - shutting down
                pass
        self._source = None
