"""Readers that make only one rank's rows of every batch (data parallel input, 1/N of the work).

``reader.shard(rank, world_size)`` returns a reader of the same batches' rows
``[r * n // N, (r + 1) * n // N)`` for a batch of ``n`` rows (``n // N`` rows per rank; the
last ``n % N`` rows of an uneven batch are dropped, the same ones on every rank), or None when
a stage cannot shard (the caller then cuts rows out of whole batches,
:mod:`hotloop.parallel.sharding`). The sharded reader keeps the *global* position: its
``state_dict`` counts the same batches as the unsharded reader's, so a checkpoint resumes
under any world size. A batch with fewer rows than ranks is yielded as ``None`` by every rank
(the position still counts it; the caller skips it).

Where the rows come from:

- a batching stage over an indexable upstream (arrays, shards, an indexable shuffle or map):
  by index, only this rank's items are read and collated (:class:`ShardedBatched`);
- over a stream (a generator, a map with workers): every item is still produced, but only
  this rank's rows of each group are collated (by stride through the stream);
- :class:`~hotloop.data.stages.Bucket` groups items by length from every item's length, then
  collates only this rank's rows of each group;
- LM windows (:class:`~hotloop.data.sources.StreamWindows`): this rank's rows of the ``[B, N/B]``
  token matrix, so each rank carries the state of its own contiguous streams;
- a stage over batches (take, skip, repeat, shuffle, select, a ``rowwise`` map) shards its upstream.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Iterator

from .reader import Reader

__all__ = ["groups_of", "rank_rows", "ShardedBatched", "shard_batches", "shard_upstream"]

log = logging.getLogger("hotloop.data")


def groups_of(items: Iterator[Any], size: int, drop_last: bool) -> Iterator[list[Any]]:
    """Consecutive groups of ``size`` items (the last one shorter unless ``drop_last``)."""
    group: list[Any] = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group and not drop_last:
        yield group


def rank_rows(rows: int, rank: int, world_size: int) -> tuple[int, int] | None:
    """``(lo, hi)``: this rank's rows of a batch of ``rows`` (None when ``rows < world_size``)."""
    per_rank = rows // world_size
    return None if per_rank == 0 else (rank * per_rank, (rank + 1) * per_rank)


class _UnevenWarning:
    def __init__(self, world_size: int) -> None:
        self.world_size, self.warned = world_size, False

    def check(self, rows: int) -> None:
        if rows % self.world_size and not self.warned:
            self.warned = True
            log.warning("a batch of %d rows does not split over %d ranks: its last %d row(s) are dropped%s",
                        rows, self.world_size, rows % self.world_size,
                        " (the batch is skipped)" if rows < self.world_size else "")


class ShardedBatched(Reader):
    """:class:`~hotloop.data.stages.Batched` that reads and collates only one rank's rows."""

    def __init__(self, upstream: Reader, batch_size: int, collate: Callable[[list[Any]], Any],
                 drop_last: bool, rank: int, world_size: int) -> None:
        super().__init__(upstream)
        self.batch_size, self.collate, self.drop_last = batch_size, collate, drop_last
        self.rank, self.world_size = rank, world_size
        self._uneven = _UnevenWarning(world_size)

    def _num_items(self, epoch: int) -> int | None:
        n = self.upstream._num_items(epoch)
        if n is None:
            return None
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _cut(self, group: list[Any]) -> Any:
        self._uneven.check(len(group))
        part = rank_rows(len(group), self.rank, self.world_size)
        return None if part is None else self.collate(group[part[0]:part[1]])

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        n = self.upstream._num_items(epoch)
        if self.upstream.indexable and n is not None:
            for index in range(start, self._num_items(epoch) or 0):
                first = index * self.batch_size
                rows = min(self.batch_size, n - first)
                self._uneven.check(rows)
                part = rank_rows(rows, self.rank, self.world_size)
                if part is None:
                    yield None
                    continue
                yield self.collate([self.upstream._get(epoch, first + i) for i in range(*part)])
            return
        items = self.upstream._iter_from(epoch, start * self.batch_size)
        for group in groups_of(items, self.batch_size, self.drop_last):
            yield self._cut(group)   # a stream: every item is made, only this rank's are collated


def shard_batches(stage: Any, rank: int, world_size: int) -> ShardedBatched:
    """The sharded form of a :class:`~hotloop.data.stages.Batched` stage."""
    return ShardedBatched(stage.upstream, stage.batch_size, stage.collate, stage.drop_last, rank, world_size)


def shard_upstream(stage: Reader, rank: int, world_size: int) -> Reader | None:
    """A copy of a 1:1 stage over batches whose upstream is sharded (None when it cannot be)."""
    upstream = stage.upstream.shard(rank, world_size) if stage.upstream is not None else None
    if upstream is None:
        return None
    out = copy.copy(stage)
    out.upstream = upstream
    out._epoch, out._position = stage._epoch, stage._position
    return out


class _SkipNone:
    """``fn`` applied to a rank's batch; a skipped batch (None) passes through."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, batch: Any) -> Any:
        return None if batch is None else self.fn(batch)


def shard_rowwise_map(stage: Any, rank: int, world_size: int) -> Reader | None:
    """A ``rowwise`` map over batches, over its sharded upstream (its function sees this rank's rows)."""
    out = shard_upstream(stage, rank, world_size)
    if out is not None:
        out.fn = _SkipNone(stage.fn)
        out._pool = None
    return out


def shard_bucket(stage: Any, rank: int, world_size: int) -> Reader:
    """A :class:`~hotloop.data.stages.Bucket` that collates only this rank's rows of each group."""
    out = copy.copy(stage)
    uneven = _UnevenWarning(world_size)
    collate = stage.collate

    def collate_mine(group: list[Any]) -> Any:
        uneven.check(len(group))
        part = rank_rows(len(group), rank, world_size)
        return None if part is None else collate(group[part[0]:part[1]])
    out.collate = collate_mine
    out._epoch, out._position = stage._epoch, stage._position
    return out
