"""torch data as readers: map-style datasets, ``IterableDataset``, ``DataLoader``, ``StatefulDataLoader``.

Every source here is a :class:`~hotloop.data.Reader` (``state_dict`` is ``{"epoch", "position"}``,
plus ``"loader"`` for a ``StatefulDataLoader``); the epoch's order is a function of
``(seed, epoch)``, so a run and its resumed copy see the same batches:

- :class:`IndexSource` + :class:`BatchFetch`: a map-style dataset read by batches of indices
  (``__getitems__`` when the dataset has it), in worker processes or threads
  (:func:`fetch_stage`); resumes exactly (indices are skipped, no item is loaded).
- :class:`LoaderReader`: a ``DataLoader``. Over a map-style dataset the epoch's index batches
  are drawn from the loader's own (batch) sampler, seeded per epoch through the sampler's
  ``generator`` / ``set_epoch``, and read by a loader with the same dataset, ``collate_fn``,
  workers, pinning and worker init: resumes exactly. Over an ``IterableDataset`` (or an
  unsized sampler, or a ``DataLoader`` subclass) it is iterated as it is and resumes by
  replay (the consumed batches are read again and dropped).
- :class:`StatefulLoaderReader`: torchdata's ``StatefulDataLoader``; its ``state_dict`` is
  checkpointed, so resume is exact.
- :class:`IterableSource`: an ``IterableDataset`` (its ``set_epoch`` called when it has one),
  resumed by replay.

:func:`as_batch` turns what a loader yields into the batch dict: a mapping stays as it is, an
``(inputs, targets)`` pair becomes ``{"inputs", "targets"}``, a tensor becomes ``{"inputs"}``.
"""
from __future__ import annotations

import array
import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from ..errors import UserError
from .collate import collate, is_text
from .errors import ReaderError
from .reader import Reader

__all__ = ["BatchFormatError", "IndexSource", "BatchFetch", "LoaderReader", "StatefulLoaderReader", "IterableSource",
           "as_batch", "as_example", "TextCheck", "epoch_seed", "is_stateful_loader", "REPLAY_NOTICE"]

#: what a reader that is not resumable says once when a run starts
REPLAY_NOTICE = ("reader: {what} is not resumable; a resumed run replays its epoch from the start "
                 "and skips the batches already consumed (the data must come in the same order)")


class BatchFormatError(ReaderError, UserError):
    """A batch hotloop cannot use (wrong shape of container, strings where ids are read); one line."""


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for ``(seed, epoch)`` (the same on every machine)."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch]).generate_state(2, np.uint64)[0] >> 1)


def as_example(item: Any) -> Any:
    """An ``(inputs, targets)`` pair as ``{"inputs", "targets"}``; anything else as it is."""
    if isinstance(item, tuple) and len(item) == 2:
        return {"inputs": item[0], "targets": item[1]}
    return item


def as_batch(batch: Any, refuse_text: tuple[str, ...] = ()) -> dict[str, Any]:
    """A loader's batch as the hotloop batch dict (see the module docstring).

    A field named in ``refuse_text`` that holds strings is a one-line error naming it.
    """
    if isinstance(batch, Mapping):
        out = dict(batch)
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        out = {"inputs": batch[0], "targets": batch[1]}
    elif isinstance(batch, torch.Tensor):
        out = {"inputs": batch}
    else:
        out = None
    if out is not None:
        for key in refuse_text:
            value = out.get(key)
            if isinstance(value, (list, tuple)) and value and is_text(value[0]):
                raise BatchFormatError(f"data: column {key!r} holds strings, but the model reads token ids there; "
                                "tokenize it first (dataset.map with a tokenizer) or rename the column")
        return out
    kind = f"a {len(batch)}-tuple" if isinstance(batch, (tuple, list)) else f"of type {type(batch).__name__}"
    raise BatchFormatError(f"data: a batch is {kind}; expected a dict of columns, an (inputs, targets) pair "
                    "or a tensor (return a dict from your Dataset or collate_fn)")


class TextCheck:
    """``batch -> batch``, refusing strings under ``keys`` (see :func:`as_batch`)."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys

    def __call__(self, batch: Any) -> dict[str, Any]:
        return as_batch(batch, self.keys)


def is_stateful_loader(obj: Any) -> bool:
    """Whether ``obj`` is torchdata's ``StatefulDataLoader`` (without importing torchdata)."""
    return any(c.__name__ == "StatefulDataLoader" and c.__module__.startswith("torchdata")
               for c in type(obj).__mro__)


class IndexSource(Reader):
    """The indices ``0 .. n-1`` (indexable: shuffles and batches of it resume by arithmetic)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    @property
    def indexable(self) -> bool:
        return True

    def _num_items(self, epoch: int) -> int:
        return self.size

    def _get(self, epoch: int, index: int) -> int:
        return index

    def _iter_from(self, epoch: int, start: int) -> Iterator[int]:
        return iter(range(start, self.size))


class BatchFetch:
    """``indices -> batch``: the dataset's items collated (picklable when the dataset is)."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None = None,
                 pad_id: int = 0) -> None:
        self.dataset, self.collate_fn, self.pad_id = dataset, collate_fn, pad_id

    def __call__(self, indices: list[int]) -> dict[str, Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
        if self.collate_fn is not None:
            return as_batch(self.collate_fn(items))
        return as_batch(collate([as_example(item) for item in items], self.pad_id, keep_dtypes=True))


@contextlib.contextmanager
def _seeded_sampling(samplers: list[Any], seed: int) -> Iterator[None]:
    """Give each sampler with a ``generator`` attribute a generator seeded by ``seed`` meanwhile."""
    saved = []
    for index, sampler in enumerate(samplers):
        if hasattr(sampler, "generator"):
            saved.append((sampler, sampler.generator))
            sampler.generator = torch.Generator().manual_seed(seed + index)
    try:
        yield
    finally:
        for sampler, generator in saved:
            sampler.generator = generator


def _samplers(loader: Any) -> list[Any]:
    found = [loader.sampler]
    inner = getattr(loader.batch_sampler, "sampler", None)
    if loader.batch_sampler is not None:
        found.append(loader.batch_sampler)
    if inner is not None and inner is not loader.sampler:
        found.append(inner)
    return found


class _EpochBatches(Sampler):
    """An epoch's index batches from a position on; batches of ints are packed in one int64 array
    (8 bytes an index, not a Python int each), handed out as lists."""

    def __init__(self) -> None:
        self._flat = np.zeros(0, dtype=np.int64)
        self._offsets = np.zeros(1, dtype=np.int64)
        self._items: list[Any] | None = None       # batches that are not lists of ints, as drawn

    def fill(self, batches: Iterable[Any], start: int) -> None:
        """Hold ``batches`` (one epoch, in order) without the first ``start``."""
        flat, lengths, items = array.array("q"), [], None
        for batch in batches:
            if items is None and isinstance(batch, list) and all(type(i) is int for i in batch):
                flat.extend(batch)
                lengths.append(len(batch))
                continue
            if items is None:
                items = self._unpack(np.frombuffer(flat, dtype=np.int64), lengths)
            items.append(batch)
        if items is not None:
            self._items = items[start:]
            return
        self._items = None
        offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
        begin = offsets[min(start, len(lengths))]
        self._flat = np.frombuffer(flat, dtype=np.int64)[begin:]
        self._offsets = offsets[min(start, len(lengths)):] - begin

    @staticmethod
    def _unpack(flat: np.ndarray, lengths: list[int]) -> list[Any]:
        bounds = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).tolist()
        return [flat[lo:hi].tolist() for lo, hi in zip(bounds[:-1], bounds[1:])]

    def __iter__(self) -> Iterator[Any]:
        if self._items is not None:
            return iter(self._items)
        bounds = self._offsets.tolist()
        return (self._flat[lo:hi].tolist() for lo, hi in zip(bounds[:-1], bounds[1:]))

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else len(self._offsets) - 1


def _sized(obj: Any) -> bool:
    try:
        len(obj)
    except TypeError:
        return False
    return True


class LoaderReader(Reader):
    """A ``torch.utils.data.DataLoader`` as a reader (see the module docstring)."""

    def __init__(self, loader: DataLoader, seed: int = 0, refuse_text: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.loader, self.seed, self.refuse_text = loader, seed, refuse_text
        index_source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
        self.resumable = (type(loader) is DataLoader and not isinstance(loader.dataset, IterableDataset)
                          and _sized(index_source))
        self._pending = _EpochBatches()
        self._inner: DataLoader | None = None
        self._generator = torch.Generator()
        self.notices = [] if self.resumable else [REPLAY_NOTICE.format(what=self._describe())]

    def _describe(self) -> str:
        if isinstance(self.loader.dataset, IterableDataset):
            return "a DataLoader over an IterableDataset"
        if type(self.loader) is not DataLoader:
            return f"a {type(self.loader).__name__} (a DataLoader subclass)"
        return "a DataLoader with an unsized sampler"

    def _num_items(self, epoch: int) -> int | None:
        try:
            return len(self.loader)
        except TypeError:
            return None

    def epoch_batches(self, epoch: int) -> list[Any]:
        """The loader's index batches (or indices) of ``epoch``, drawn from its sampler."""
        batches = _EpochBatches()
        self._draw(epoch, batches, 0)
        return list(batches)

    def _draw(self, epoch: int, into: _EpochBatches, start: int) -> None:
        for sampler in _samplers(self.loader):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        source = self.loader.batch_sampler if self.loader.batch_sampler is not None else self.loader.sampler
        with _seeded_sampling(_samplers(self.loader), epoch_seed(self.seed, epoch)):
            into.fill(iter(source), start)

    def _inner_loader(self) -> DataLoader:
        if self._inner is None:
            loader = self.loader
            options: dict[str, Any] = dict(
                num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                timeout=loader.timeout, worker_init_fn=loader.worker_init_fn, generator=self._generator,
                multiprocessing_context=loader.multiprocessing_context,
                persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device)
            if loader.num_workers:
                options["prefetch_factor"] = loader.prefetch_factor
                options["in_order"] = getattr(loader, "in_order", True)
            if loader.batch_sampler is not None:
                self._inner = DataLoader(loader.dataset, batch_sampler=self._pending, **options)
            else:
                self._inner = DataLoader(loader.dataset, batch_size=None, sampler=self._pending, **options)
        return self._inner

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        if not self.resumable:
            dataset = self.loader.dataset
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)
            for index, batch in enumerate(self.loader):
                if index >= start:
                    yield as_batch(batch, self.refuse_text)
            return
        self._draw(epoch, self._pending, start)
        self._generator.manual_seed(epoch_seed(self.seed, epoch) ^ 1)    # worker seeds of this epoch
        for batch in self._inner_loader():
            yield as_batch(batch, self.refuse_text)


class StatefulLoaderReader(Reader):
    """torchdata's ``StatefulDataLoader``; its state rides in ``state_dict()["loader"]``.

    A fresh epoch reseeds the loader's sampler generator (and ``loader.generator``) from
    ``(seed, epoch)``; a position inside an epoch is restored with the loader's own
    ``load_state_dict``.
    """

    resumable = True
    notices: list[str] = []

    def __init__(self, loader: Any, seed: int = 0, refuse_text: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.loader, self.seed, self.refuse_text = loader, seed, refuse_text
        self._loaded: dict[str, Any] | None = None   # a loader state waiting for the next iteration

    def _num_items(self, epoch: int) -> int | None:
        try:
            return len(self.loader)
        except TypeError:
            return None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._loaded is not None:
            state["loader"] = self._loaded
        else:   # asked before an epoch starts, the loader would make its iterator (and order) too early
            state["loader"] = self.loader.state_dict() if self._position > 0 else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        loader_state = state.get("loader")
        self._loaded = loader_state if loader_state is not None and self._position > 0 else None
        if self._loaded is not None:
            self.loader.load_state_dict(self._loaded)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._loaded = None
        super().set_epoch(epoch)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        skip = 0
        if self._loaded is None:
            seed = epoch_seed(self.seed, epoch)
            for index, sampler in enumerate(_samplers(self.loader)):
                if isinstance(getattr(sampler, "generator", None), torch.Generator):
                    sampler.generator.manual_seed(seed + index)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
            self.loader.generator = torch.Generator().manual_seed(seed ^ 1)
            skip = start     # no loader state for this position: replay
        self._loaded = None
        for index, batch in enumerate(self.loader):
            if index >= skip:
                yield as_batch(batch, self.refuse_text)


class IterableSource(Reader):
    """The items of an ``IterableDataset`` (or any re-iterable), one pass per epoch; replayed on resume."""

    resumable = False

    def __init__(self, dataset: Any, what: str = "an IterableDataset") -> None:
        super().__init__()
        self.dataset = dataset
        self.notices = [REPLAY_NOTICE.format(what=what)]

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        items = iter(self.dataset)
        try:
            for index, item in enumerate(items):
                if index >= start:
                    yield as_example(item)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
