"""Sources: the first stage of a chain (arrays, generators, on-disk shards, LM streams)."""
from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from .errors import DataError
from .reader import Reader
from .shards import RaggedArray, open_array, read_manifest, split_fields

__all__ = ["from_arrays", "from_generator", "from_shards", "ArraySource", "GeneratorSource",
           "StreamWindows", "stream_windows"]


class ArraySource(Reader):
    """Rows of equally long arrays; an item is a dict (or tuple, or a single row)."""

    def __init__(self, arrays: Mapping[str, Any] | Sequence[Any] | Any) -> None:
        super().__init__()
        if isinstance(arrays, Mapping):
            self._keys: list[str] | None = list(arrays)
            columns = list(arrays.values())
            self._single = False
        elif isinstance(arrays, (tuple, list)):
            self._keys, columns, self._single = None, list(arrays), False
        else:
            self._keys, columns, self._single = None, [arrays], True
        lengths = {len(c) for c in columns}
        if len(lengths) != 1:
            raise ValueError(f"from_arrays: columns differ in length: {sorted(lengths)}")
        self._columns = columns
        self._n = lengths.pop()

    @property
    def indexable(self) -> bool:
        return True

    def _num_items(self, epoch: int) -> int:
        return self._n

    def _get(self, epoch: int, index: int) -> Any:
        row = [c[index] for c in self._columns]
        if self._single:
            return row[0]
        if self._keys is not None:
            return dict(zip(self._keys, row))
        return tuple(row)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        for index in range(start, self._n):
            yield self._get(epoch, index)


class GeneratorSource(Reader):
    """Items of ``factory()`` (or ``factory(epoch)`` when it takes a required positional or an
    ``epoch`` parameter): a fresh generator each epoch.

    Resuming at position ``p`` replays the generator and discards ``p`` items,
    so the factory must be deterministic for a given epoch.
    """

    def __init__(self, factory: Callable[..., Iterable[Any]]) -> None:
        super().__init__()
        if not callable(factory):
            raise TypeError("from_generator needs a callable that returns an iterable "
                            "(pass the generator function, not a generator object)")
        self._factory = factory
        try:  # pass the epoch when the factory has a required positional parameter or one named "epoch"
            params = inspect.signature(factory).parameters
            self._takes_epoch = "epoch" in params or any(
                p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                for p in params.values())
        except (TypeError, ValueError):
            self._takes_epoch = False

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        items = iter(self._factory(epoch) if self._takes_epoch else self._factory())
        try:
            for index, item in enumerate(items):
                if index >= start:
                    yield item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()


class ShardSource(Reader):
    """Examples of a prepared split: dicts of 1-D int arrays read from memory-mapped shards.

    The manifest's ``meta.splits[split].fields`` maps a field name to the
    ``(tokens, offsets)`` file names of its ragged array.
    """

    def __init__(self, data_dir: str | Path, split: str, *, verify: bool = True) -> None:
        super().__init__()
        manifest = read_manifest(data_dir)
        self._fields: dict[str, RaggedArray] = {}
        for field, (tokens_file, offsets_file) in split_fields(data_dir, manifest, split).items():
            tokens = open_array(data_dir, tokens_file, manifest, verify=verify)
            offsets = open_array(data_dir, offsets_file, manifest, verify=verify)
            self._fields[field] = RaggedArray(tokens, offsets, str(Path(data_dir) / offsets_file))
        sizes = {len(r) for r in self._fields.values()}
        if len(sizes) != 1:
            raise DataError(f"{Path(data_dir)}: fields of split {split!r} differ in length; re-run datagen")
        self._n = sizes.pop()

    @property
    def indexable(self) -> bool:
        return True

    def _num_items(self, epoch: int) -> int:
        return self._n

    def lengths(self, field: str) -> np.ndarray:
        return self._fields[field].lengths()

    def _get(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        return {name: r[index] for name, r in self._fields.items()}

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        for index in range(start, self._n):
            yield self._get(epoch, index)


class StreamWindows(Reader):
    """Contiguous language-model windows (Zaremba / TF ``ptb_producer``).

    ``tokens`` (N,) is cut to ``[B, N // B]``; window ``i`` is
    ``inputs = data[:, i*T:(i+1)*T]`` and ``targets`` the same shifted by one,
    for ``i < (N // B - 1) // T``. Never shuffled: row ``b`` of window ``i + 1``
    continues row ``b`` of window ``i``, so a model may carry its state.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, num_steps: int) -> None:
        super().__init__()
        if batch_size < 1 or num_steps < 1:
            raise ValueError(f"stream_windows: batch_size={batch_size} and num_steps={num_steps} must be >= 1")
        columns = len(tokens) // batch_size
        self._windows = (columns - 1) // num_steps
        if self._windows < 1:
            raise ValueError(f"stream_windows: {len(tokens)} tokens are too few for batch_size="
                             f"{batch_size} x num_steps={num_steps}")
        self._data = np.asarray(tokens[:batch_size * columns]).reshape(batch_size, columns)  # [B, N//B]
        self.batch_size, self.num_steps = batch_size, num_steps

    def shard(self, rank: int, world_size: int) -> "StreamWindows | None":
        """This rank's rows ``[r B/N, (r+1) B/N)`` of every window (its own contiguous streams)."""
        from .row_shard import rank_rows
        part = rank_rows(self.batch_size, rank, world_size)
        if part is None:
            return None   # fewer streams than ranks: the caller skips every window, as before
        out = copy.copy(self)
        out._data = self._data[part[0]:part[1]]   # [B/N, N//B], a view
        out.batch_size = part[1] - part[0]
        return out

    @property
    def indexable(self) -> bool:
        return True

    def _num_items(self, epoch: int) -> int:
        return self._windows

    def _get(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self._windows:
            raise IndexError(f"window {index} out of range [0, {self._windows})")
        lo = index * self.num_steps
        window = self._data[:, lo:lo + self.num_steps + 1].astype(np.int64)  # [B, T+1]
        return {"inputs": torch.from_numpy(np.ascontiguousarray(window[:, :-1])),   # [B, T]
                "targets": torch.from_numpy(np.ascontiguousarray(window[:, 1:]))}   # [B, T]

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        for index in range(start, self._windows):
            yield self._get(epoch, index)


def from_arrays(arrays: Mapping[str, Any] | Sequence[Any] | Any) -> ArraySource:
    """A source over rows of arrays: a dict of columns, a tuple of columns, or one array."""
    return ArraySource(arrays)


def from_generator(factory: Callable[..., Iterable[Any]]) -> GeneratorSource:
    """A source calling ``factory()`` (or ``factory(epoch)``) once per epoch."""
    return GeneratorSource(factory)


def from_shards(data_dir: str | Path, split: str, *, verify: bool = True) -> ShardSource:
    """A source over a prepared split (memory-mapped; checksums verified on open unless ``verify=False``)."""
    return ShardSource(data_dir, split, verify=verify)


def stream_windows(tokens: np.ndarray, batch_size: int, num_steps: int) -> StreamWindows:
    """A resumable reader of contiguous ``[B, T]`` LM windows (see :class:`StreamWindows`)."""
    return StreamWindows(tokens, batch_size, num_steps)
