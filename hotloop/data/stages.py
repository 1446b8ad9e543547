"""Stages: shuffle, map, batch, bucket, repeat, take, skip (see :mod:`hotloop.data.reader`)."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .collate import collate as default_collate
from .reader import Reader
from .row_shard import groups_of, shard_batches, shard_bucket, shard_rowwise_map, shard_upstream

__all__ = ["Shuffle", "Map", "Batched", "Bucket", "Repeat", "Take", "Skip", "Select", "bucket_boundaries",
           "shuffle_order"]


def _skip(items: Iterator[Any], count: int) -> Iterator[Any]:
    for index, item in enumerate(items):
        if index >= count:
            yield item


def shuffle_order(items: Iterator[Any], buffer_size: int, rng: np.random.Generator) -> Iterator[Any]:
    """Buffered shuffle: keep ``buffer_size`` items, emit a random one per new item, then drain.

    The emitted order depends only on the RNG and the stream length, never on item values.
    """
    buffer: list[Any] = []
    uniforms = rng.random(1024)
    used = 0
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        if used == len(uniforms):
            uniforms, used = rng.random(1024), 0
        slot = int(uniforms[used] * len(buffer))
        used += 1
        out, buffer[slot] = buffer[slot], item
        yield out
    for slot in rng.permutation(len(buffer)):
        yield buffer[slot]


class Shuffle(Reader):
    """Seeded buffered shuffle, reshuffled per epoch (``rng = default_rng([seed, epoch])``).

    Over an indexable upstream the order is computed on indices, so resuming is
    O(1) in item work; over a generator it is replayed.
    """

    def __init__(self, upstream: Reader, buffer_size: int, seed: int = 0) -> None:
        super().__init__(upstream)
        if buffer_size < 1:
            raise ValueError(f"shuffle buffer_size must be >= 1, got {buffer_size}")
        self.buffer_size, self.seed = buffer_size, seed
        self._order: tuple[int, np.ndarray] | None = None

    def shard(self, rank: int, world_size: int) -> Reader | None:
        """Over batches: the same order (it depends only on the seed, epoch and length) of sharded batches."""
        return None if self.upstream.indexable else shard_upstream(self, rank, world_size)

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    @property
    def indexable(self) -> bool:
        return self.upstream.indexable

    def _num_items(self, epoch: int) -> int | None:
        return self.upstream._num_items(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of upstream indices for ``epoch`` (indexable upstream only)."""
        if self._order is None or self._order[0] != epoch:
            n = self.upstream._num_items(epoch)
            perm = np.fromiter(shuffle_order(iter(range(n)), self.buffer_size, self._rng(epoch)),
                               dtype=np.int64, count=n)
            self._order = (epoch, perm)
        return self._order[1]

    def _get(self, epoch: int, index: int) -> Any:
        return self.upstream._get(epoch, int(self.order(epoch)[index]))

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        if self.indexable:
            order = self.order(epoch)
            for index in range(start, len(order)):
                yield self.upstream._get(epoch, int(order[index]))
            return
        items = self.upstream._iter_from(epoch, 0)
        yield from _skip(shuffle_order(items, self.buffer_size, self._rng(epoch)), start)


class Map(Reader):
    """Apply ``fn`` to every item, in this process or in ``workers`` processes (order kept).

    Workers receive ``chunksize`` items per message (fewer round trips for cheap
    items) and keep up to ``inflight`` chunks each in flight.
    """

    def __init__(self, upstream: Reader, fn: Callable[[Any], Any], *, workers: int = 0,
                 ordered: bool = True, mp_context: str | None = None, inflight: int = 2,
                 chunksize: int = 1, rowwise: bool = False) -> None:
        super().__init__(upstream)
        if workers < 0 or inflight < 1 or chunksize < 1:
            raise ValueError(f"map: workers={workers} must be >= 0, inflight={inflight} and "
                             f"chunksize={chunksize} >= 1")
        self.fn, self.workers, self.ordered = fn, workers, ordered
        self.mp_context, self.inflight, self.chunksize = mp_context, inflight, chunksize
        self.rowwise = rowwise   # over batches: fn treats each row alone, so a rank may map only its rows
        self._pool: Any = None

    def shard(self, rank: int, world_size: int) -> Reader | None:
        return shard_rowwise_map(self, rank, world_size) if self.rowwise else None

    @property
    def indexable(self) -> bool:
        return self.workers == 0 and self.upstream.indexable

    def _num_items(self, epoch: int) -> int | None:
        return self.upstream._num_items(epoch)

    def _get(self, epoch: int, index: int) -> Any:
        return self.fn(self.upstream._get(epoch, index))

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        items = self.upstream._iter_from(epoch, start)  # 1:1, so skipping never runs fn
        if self.workers == 0:
            for item in items:
                yield self.fn(item)
            return
        from .workers import WorkerPool
        if self._pool is None or self._pool.broken:
            self._pool = WorkerPool(self.fn, self.workers, mp_context=self.mp_context,
                                    inflight=self.inflight, chunksize=self.chunksize)
        completed = False
        try:
            yield from self._pool.imap(items, ordered=self.ordered)
            completed = True
        finally:
            if not completed:  # break, exception or Ctrl-C: do not leave processes behind
                self.close_pool()

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def close(self) -> None:
        self.close_pool()
        super().close()


class Batched(Reader):
    """Group ``batch_size`` items and collate them (default: pad with ``pad_id`` to ``dict[str, Tensor]``)."""

    def __init__(self, upstream: Reader, batch_size: int, *, collate: Callable[[list[Any]], Any] | None = None,
                 drop_last: bool = False, pad_id: int = 0) -> None:
        super().__init__(upstream)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size, self.drop_last, self.pad_id = batch_size, drop_last, pad_id
        self.collate = collate or (lambda items: default_collate(items, pad_id))

    def shard(self, rank: int, world_size: int) -> Reader:
        return shard_batches(self, rank, world_size)

    def _num_items(self, epoch: int) -> int | None:
        n = self.upstream._num_items(epoch)
        if n is None:
            return None
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        items = self.upstream._iter_from(epoch, start * self.batch_size)
        for group in groups_of(items, self.batch_size, self.drop_last):
            yield self.collate(group)


def bucket_boundaries(max_length: int, min_length: int = 8, step: float = 1.1) -> list[int]:
    """Geometric bucket upper bounds ``8, 9, ..., ~x*1.1^k`` below ``max_length`` (as in T2T)."""
    bounds, x = [], min_length
    while x < max_length:
        bounds.append(x)
        x = max(x + 1, int(x * step))
    return bounds + [max_length]


def _default_length(item: Any) -> int:
    if type(item) is dict or isinstance(item, Mapping):
        return max(len(v) for v in item.values())
    if isinstance(item, tuple):
        return max(len(v) for v in item)
    return len(item)


class Bucket(Reader):
    """Length-bucketed, token-budget batches (T2T style).

    An item of length ``L`` goes to the first bucket whose bound ``>= L``; a
    bucket with bound ``b`` emits a batch when it holds ``max(1, max_tokens // b)``
    items, so every padded batch has at most ``max_tokens`` tokens per field.
    Items longer than ``max_length`` (default ``max_tokens``) are dropped.
    At the end of the epoch the items left in partial buckets are sorted by length and
    packed into as few batches as the budget allows (``rows * longest <= max_tokens``), and
    those batches come in an order shuffled by the epoch number: the epoch ends with a few
    full batches of mixed lengths instead of one small batch per bucket in length order.
    """

    def __init__(self, upstream: Reader, max_tokens: int, *, length_fn: Callable[[Any], int] | None = None,
                 max_length: int | None = None, min_length: int = 8, step: float = 1.1,
                 collate: Callable[[list[Any]], Any] | None = None, pad_id: int = 0) -> None:
        super().__init__(upstream)
        if max_tokens < 1:
            raise ValueError(f"bucket max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens, self.max_length = max_tokens, max_length or max_tokens
        self.bounds = bucket_boundaries(self.max_length, min(min_length, self.max_length), step)
        self.sizes = [max(1, max_tokens // b) for b in self.bounds]
        self._slot_of = np.searchsorted(self.bounds, np.arange(self.max_length + 1)).tolist()
        self.length_fn = length_fn or _default_length
        self.collate = collate or (lambda items: default_collate(items, pad_id))

    def shard(self, rank: int, world_size: int) -> Reader:
        return shard_bucket(self, rank, world_size)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        def batches() -> Iterator[list[Any]]:
            buckets: list[list[Any]] = [[] for _ in self.bounds]
            for item in self.upstream._iter_from(epoch, 0):
                length = self.length_fn(item)
                if length > self.max_length:
                    continue
                slot = self._slot_of[length]
                buckets[slot].append(item)
                if len(buckets[slot]) == self.sizes[slot]:
                    yield buckets[slot]
                    buckets[slot] = []
            yield from self._pack_leftovers([item for bucket in buckets for item in bucket], epoch)
        for index, group in enumerate(batches()):
            if index >= start:  # replay: bucketing needs every upstream item's length
                yield self.collate(group)

    def _pack_leftovers(self, items: list[Any], epoch: int) -> list[list[Any]]:
        """``items`` by length into token-budget batches, in a seeded (by ``epoch``) order."""
        groups: list[list[Any]] = []
        group: list[Any] = []
        for longest, item in sorted(((self.length_fn(i), i) for i in items), key=lambda pair: pair[0]):
            # sorted by length: the newest item is the group's longest
            if group and (len(group) + 1) * longest > self.max_tokens:
                groups.append(group)
                group = []
            group.append(item)
        if group:
            groups.append(group)
        order = np.random.default_rng(epoch).permutation(len(groups))
        return [groups[i] for i in order]


class Repeat(Reader):
    """One epoch = ``count`` upstream epochs (``None``: endless)."""

    def __init__(self, upstream: Reader, count: int | None = None) -> None:
        super().__init__(upstream)
        if count is not None and count < 1:
            raise ValueError(f"repeat count must be >= 1 or None, got {count}")
        self.count = count

    def shard(self, rank: int, world_size: int) -> Reader | None:
        return shard_upstream(self, rank, world_size)

    def _num_items(self, epoch: int) -> int | None:
        if self.count is None:
            return None
        sizes = [self.upstream._num_items(epoch * self.count + k) for k in range(self.count)]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        k = 0
        while self.count is None or k < self.count:
            sub_epoch = epoch * self.count + k if self.count else k
            size = self.upstream._num_items(sub_epoch)
            seen = 0
            if size is not None:  # skip by arithmetic
                if start < size:
                    yield from self.upstream._iter_from(sub_epoch, start)
                start, seen = max(0, start - size), size
            else:  # unknown length: replay and discard
                for item in self.upstream._iter_from(sub_epoch, 0):
                    seen += 1
                    if start > 0:
                        start -= 1
                        continue
                    yield item
            if seen == 0 and self.count is None:
                return  # an empty upstream would otherwise loop forever
            k += 1


class _CountedSlice(Reader):
    """Take / Skip: ``count`` items of each epoch, indexable when the upstream is."""

    def __init__(self, upstream: Reader, count: int) -> None:
        super().__init__(upstream)
        self.count = max(0, count)

    @property
    def indexable(self) -> bool:
        return self.upstream.indexable

    def shard(self, rank: int, world_size: int) -> Reader | None:
        return shard_upstream(self, rank, world_size)


class Take(_CountedSlice):
    """The first ``count`` items of each epoch."""

    def _num_items(self, epoch: int) -> int | None:
        n = self.upstream._num_items(epoch)
        return None if n is None else min(n, self.count)

    def _get(self, epoch: int, index: int) -> Any:
        return self.upstream._get(epoch, index)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        if start >= self.count:
            return
        for index, item in enumerate(self.upstream._iter_from(epoch, start), start):
            yield item
            if index + 1 >= self.count:
                return


class Skip(_CountedSlice):
    """Each epoch without its first ``count`` items."""

    def _num_items(self, epoch: int) -> int | None:
        n = self.upstream._num_items(epoch)
        return None if n is None else max(0, n - self.count)

    def _get(self, epoch: int, index: int) -> Any:
        return self.upstream._get(epoch, index + self.count)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        return self.upstream._iter_from(epoch, start + self.count)


class Select(Reader):
    """The upstream's items ``indices`` (in that order) each epoch; needs, and stays, indexable."""

    def __init__(self, upstream: Reader, indices: Sequence[int]) -> None:
        super().__init__(upstream)
        if not upstream.indexable:
            raise TypeError(f"select needs an indexable upstream, got {type(upstream).__name__}")
        self.indices = np.asarray(indices, dtype=np.int64)

    @property
    def indexable(self) -> bool:
        return True

    def _num_items(self, epoch: int) -> int:
        return len(self.indices)

    def _get(self, epoch: int, index: int) -> Any:
        return self.upstream._get(epoch, int(self.indices[index]))

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        for index in range(start, len(self.indices)):
            yield self._get(epoch, index)
