"""Split a reader over ranks: each rank takes its own contiguous rows of every batch.

``hp.batch_size`` stays the *global* batch. Every rank follows the same
reader (same seed, so the same epoch shuffle) and gets rows
``[r * B / N, (r + 1) * B / N)`` of each batch, so the ranks read disjoint
data, run the same number of steps (no deadlock at the end of an epoch), and
N ranks x B/N rows compute the same averaged gradient as one process with B
rows. For streamed LM windows ``[B, T]`` this gives every rank its own
contiguous streams, so a carried recurrent state stays valid.

Where the reader can (``reader.shard(rank, world_size)``, :mod:`hotloop.data.row_shard`:
hotloop's batching stages, LM windows, and the stages over them), each rank reads and collates
only its own rows; otherwise (a reader that makes whole batches, such as a generated problem's
seeded batches, or one without ``shard``) every rank makes the whole batch and keeps its rows.
Either way the rows, and the reader position, are the same. With ragged items a natively
sharded rank pads its rows to their own longest (the rows cut from a whole batch are padded to
the whole batch's longest); the padding is ignored by losses and metrics.

Uneven tails: a batch whose row count is not a multiple of N loses its last
``rows % N`` rows (the same rows on every rank); a batch with fewer than N
rows is skipped by every rank.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from torch import Tensor

from .errors import ShardingError
from ..data.wrapper import ReaderWrapper

__all__ = ["ShardedReader", "shard_rows", "batch_rows"]

log = logging.getLogger(__name__)

# Fluent reader stages: chaining them on the sharded reader would silently
# apply them to the unsharded upstream, so they must come before sharding.
_STAGE_METHODS = frozenset({"shuffle", "map", "batch", "bucket", "repeat", "take", "prefetch"})


def batch_rows(batch: Any) -> int:
    """Rows (dim 0) of a batch: ``targets`` if present, else the first tensor."""
    if isinstance(batch, Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        tensor = batch.get("targets")
        if not isinstance(tensor, Tensor):
            tensor = next((v for v in batch.values() if isinstance(v, Tensor) and v.dim() > 0), None)
        if tensor is not None and tensor.dim() > 0:
            return tensor.shape[0]
    raise ShardingError(f"cannot split a batch of type {type(batch).__name__} over ranks: "
                        "expected a dict of tensors with a batch dimension")


def shard_rows(batch: Any, rank: int, world_size: int) -> Any | None:
    """This rank's rows of ``batch`` (None when the batch has fewer rows than ranks).

    Tensors whose dim 0 is not the batch size (per-batch metadata) are kept whole.
    """
    rows = batch_rows(batch)
    per_rank = rows // world_size
    if per_rank == 0:
        return None
    lo, hi = rank * per_rank, (rank + 1) * per_rank

    def cut(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == rows:
            return value[lo:hi]   # [rows, ...] -> [rows / N, ...], a view
        return value

    if isinstance(batch, Tensor):
        return cut(batch)
    return {k: cut(v) for k, v in batch.items()}


class ShardedReader(ReaderWrapper):
    """Wrap a resumable reader; yield this rank's rows of each batch.

    ``state_dict`` / ``load_state_dict`` / ``set_epoch`` / ``len`` are the
    wrapped reader's (the position is global), so a checkpoint taken with one
    world size resumes under another. :attr:`native` says whether this rank reads
    only its rows (``reader.shard``) or cuts them out of whole batches.
    """

    def __init__(self, reader: Any, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ShardingError(f"rank {rank} is not in [0, {world_size})")
        shard = getattr(reader, "shard", None) if world_size > 1 else None
        mine = shard(rank, world_size) if callable(shard) else None
        self.native = mine is not None
        self.reader = mine if mine is not None else reader
        self.rank = rank
        self.world_size = world_size
        self._warned = False

    def __iter__(self) -> Iterator[Any]:
        if self.native:   # the reader makes only this rank's rows; None: a batch too small to split
            yield from (batch for batch in self.reader if batch is not None)
            return
        for batch in self.reader:
            part = shard_rows(batch, self.rank, self.world_size)
            rows = batch_rows(batch)
            if rows % self.world_size and not self._warned:
                self._warned = True
                log.warning("a batch of %d rows does not split over %d ranks: its last %d row(s) "
                            "are dropped%s", rows, self.world_size, rows % self.world_size,
                            " (the batch is skipped)" if part is None else "")
            if part is not None:
                yield part

    def __len__(self) -> int:
        return len(self.reader)


    def __getattr__(self, name: str) -> Any:
        if name == "reader":  # not yet set (during unpickling)
            raise AttributeError(name)
        if name in _STAGE_METHODS:
            raise ShardingError(f"apply .{name}() before shard_reader(): on the sharded reader it "
                                "would run on the unsharded upstream")
        return getattr(self.reader, name)
