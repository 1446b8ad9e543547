"""Speed-test mode (like Paddle's ``FLAGS_reader_queue_speed_test_mode``).

Serves batches that were prepared once, without consuming the reader, so a
training loop measures compute-only throughput. Never use it to train: the
model sees the same few batches over and over. Off by default; warns when on.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Iterator

import torch

from .prefetch import FeedStats, to_device
from .wrapper import ReaderWrapper

__all__ = ["speed_test", "SpeedTestFeeder"]

log = logging.getLogger("hotloop.data")


class SpeedTestFeeder(ReaderWrapper):
    """Cycles ``n_prepared`` batches; an epoch has ``num_batches`` (default ``len(reader)``) of them."""

    def __init__(self, reader: Any, n_prepared: int = 8, num_batches: int | None = None,
                 device: Any = None) -> None:
        if n_prepared < 1:
            raise ValueError(f"n_prepared must be >= 1, got {n_prepared}")
        self.reader, self.n_prepared = reader, n_prepared
        self.device = torch.device(device) if device is not None else None
        if num_batches is None:
            try:
                num_batches = len(reader)
            except TypeError:
                num_batches = None
        self.num_batches = num_batches
        self._prepared: list[Any] | None = None
        self._stats = FeedStats()
        log.warning("hotloop data SPEED-TEST MODE: serving %d prepared batches repeatedly; "
                    "throughput is compute-only and the model does NOT train on the data", n_prepared)

    @property
    def stats(self) -> FeedStats:
        return self._stats

    def _prepare(self) -> list[Any]:
        if self._prepared is None:
            state = self.reader.state_dict()
            items = iter(self.reader)
            try:
                prepared = [to_device(b, self.device) for b in itertools.islice(items, self.n_prepared)]
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
            self.reader.load_state_dict(state)  # the reader is not consumed
            if not prepared:
                raise ValueError("speed_test: the reader yielded no batches")
            self._prepared = prepared
        return self._prepared

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("speed-test feeder over a reader without length is endless")
        return self.num_batches

    def __iter__(self) -> Iterator[Any]:
        prepared = self._prepare()
        count = itertools.count() if self.num_batches is None else range(self.num_batches)
        for index in count:
            self._stats.batches += 1
            yield prepared[index % len(prepared)]



def speed_test(reader: Any, n_prepared: int = 8, num_batches: int | None = None,
               device: Any = None) -> SpeedTestFeeder:
    """Serve ``n_prepared`` prepared batches repeatedly (compute-only throughput; warns)."""
    return SpeedTestFeeder(reader, n_prepared=n_prepared, num_batches=num_batches, device=device)
