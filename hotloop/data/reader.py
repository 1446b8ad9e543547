"""The :class:`Reader` base: one epoch per iteration, resumable, chainable.

A chain is built fluently::

    reader = (from_arrays({"inputs": x}).shuffle(1024, seed=1)
              .map(fn, workers=2).batch(32).prefetch(2))

Every stage is a Reader that wraps its upstream. Iteration is *functional*:
a stage produces epoch ``e`` from item ``start`` on via ``_iter_from(e, start)``,
and all randomness is derived from ``(seed, epoch)``, so ``{"epoch", "position"}``
fully describes where a reader is (the RNG state is a function of them).
Resuming skips cheaply where a stage allows it (sources index directly, ``map``
and ``batch`` translate the count upstream without running the function) and
replays otherwise (``bucket`` and buffered ``shuffle`` of a generator).

``shard(rank, world_size)`` gives a reader of only one rank's rows of every batch, at the same
global positions, where the chain allows it (:mod:`hotloop.data.row_shard`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

__all__ = ["Reader"]


class Reader:
    """Base class of sources and stages (see the module docstring)."""

    def __init__(self, upstream: "Reader | None" = None) -> None:
        self.upstream = upstream
        self._epoch = 0
        self._position = 0

    # -- what a source or stage implements ---------------------------------------------
    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        """Items of ``epoch`` from index ``start`` on."""
        raise NotImplementedError

    def _num_items(self, epoch: int) -> int | None:
        """Items in ``epoch`` if known without iterating, else None."""
        return None

    def _get(self, epoch: int, index: int) -> Any:
        """Random access (only when :attr:`indexable`)."""
        raise TypeError(f"{type(self).__name__} is not indexable")

    @property
    def indexable(self) -> bool:
        return False

    def shard(self, rank: int, world_size: int) -> "Reader | None":
        """A reader of this rank's rows of every batch (same positions), or None when this stage
        cannot make only those rows (see :mod:`hotloop.data.row_shard`)."""
        return None

    # -- the reader protocol -------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self._run()

    def _run(self) -> Iterator[Any]:
        epoch, start = self._epoch, self._position
        items = self._iter_from(epoch, start)
        try:
            for item in items:
                self._position += 1
                yield item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        if self._epoch == epoch:  # finished the epoch (not re-positioned meanwhile)
            self._epoch, self._position = epoch + 1, 0

    def __len__(self) -> int:
        n = self._num_items(self._epoch)
        if n is None:
            raise TypeError(f"{type(self).__name__} has no length (it streams from a generator)")
        return n

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position"}``: items consumed in the current epoch."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{type(self).__name__}: bad reader state {state!r}; "
                             "expected {'epoch': int, 'position': int}") from None
        if epoch < 0 or position < 0:
            raise ValueError(f"{type(self).__name__}: negative epoch/position in {state!r}")
        self._epoch, self._position = epoch, position

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch`` (a no-op when already in it, so a resumed position stays)."""
        if epoch != self._epoch:
            self._epoch, self._position = int(epoch), 0

    @property
    def epoch(self) -> int:
        return self._epoch

    def close(self) -> None:
        """Release worker processes of this chain (idempotent)."""
        if self.upstream is not None:
            self.upstream.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- fluent stages (imported lazily: stages import this module) ------------------------
    def shuffle(self, buffer_size: int, seed: int = 0) -> "Reader":
        from .stages import Shuffle
        return Shuffle(self, buffer_size, seed)

    def map(self, fn: Callable[[Any], Any], workers: int = 0, *, ordered: bool = True,
            mp_context: str | None = None, inflight: int = 2, chunksize: int = 1,
            rowwise: bool = False) -> "Reader":
        """``fn`` over every item; ``rowwise=True`` says that over batches ``fn`` treats each row
        alone (then a data-parallel rank maps only its own rows)."""
        from .stages import Map
        return Map(self, fn, workers=workers, ordered=ordered, mp_context=mp_context, inflight=inflight,
                   chunksize=chunksize, rowwise=rowwise)

    def batch(self, batch_size: int, collate: Callable[[list[Any]], Any] | None = None, *,
              drop_last: bool = False, pad_id: int = 0) -> "Reader":
        from .stages import Batched
        return Batched(self, batch_size, collate=collate, drop_last=drop_last, pad_id=pad_id)

    def bucket(self, max_tokens: int, length_fn: Callable[[Any], int] | None = None, **kwargs: Any) -> "Reader":
        from .stages import Bucket
        return Bucket(self, max_tokens, length_fn=length_fn, **kwargs)

    def repeat(self, count: int | None = None) -> "Reader":
        from .stages import Repeat
        return Repeat(self, count)

    def take(self, count: int) -> "Reader":
        from .stages import Take
        return Take(self, count)

    def skip(self, count: int) -> "Reader":
        from .stages import Skip
        return Skip(self, count)

    def select(self, indices: Sequence[int]) -> "Reader":
        from .stages import Select
        return Select(self, indices)

    def prefetch(self, capacity: int = 2, device: Any = None, double_buffer: bool = True) -> Any:
        from .prefetch import prefetch
        return prefetch(self, capacity=capacity, device=device, double_buffer=double_buffer)
