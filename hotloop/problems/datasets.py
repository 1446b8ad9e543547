"""Train on data you already have, without subclassing :class:`~hotloop.problems.base.Problem`.

:func:`problem_from_data` wraps data in one of these forms into a problem the Trainer runs
(``Trainer(loader, model, hp)`` wraps it too)::

    problem = problem_from_data(train=my_loader, valid=my_valid_loader)

| form | batches | resume |
|---|---|---|
| map-style ``torch.utils.data.Dataset`` (``len`` + ``[i]``), a list | ``hp.batch_size`` items, shuffled per epoch (train) | exact |
| Hugging Face ``datasets.Dataset`` | ``hp.batch_size`` rows, columns → tensors, shuffled (train) | exact |
| ``DataLoader`` over a map-style dataset | the loader's (sampler, batch sampler, workers, ``collate_fn``) | exact |
| torchdata ``StatefulDataLoader`` | the loader's | exact (its ``state_dict`` is checkpointed) |
| ``DataLoader`` over an ``IterableDataset``, an ``IterableDataset``, a function returning a fresh iterable | the loader's / ``hp.batch_size`` items | replay |

An exact form continues from the saved position without reading the consumed data again;
"replay" reads the epoch again from its start and drops the consumed batches, so the data
must come in the same order each time (a one-shot generator object is refused: pass the
function that makes it). A replayed reader says so in one notice when the run starts.

Items are dicts (``{"inputs": ..., "targets": ...}``), ``(inputs, targets)`` pairs, or tensors;
batches are dicts, a loader's ``(x, y)`` batches become ``{"inputs": x, "targets": y}``.
Collation keeps dtypes and pads ragged rows with ``spec.pad_id`` (:mod:`hotloop.data.collate`);
string fields stay lists of ``str``, except under ``inputs`` / ``targets`` of a token task
(``seq2seq``, ``lm``, ``classify``), where the models read ids: that is a one-line error.
``workers`` (``Strategy.num_workers``) reads a map-style dataset in worker processes
(threads when it does not pickle); a DataLoader brings its own ``num_workers``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from torch.utils.data import DataLoader, IterableDataset

from ..data import Reader, from_generator
from ..data.collate import collate
from ..data.fetching import fetch_stage
from ..data.hf_sources import ArrowFetch, derived_sizes, is_hf_dataset
from ..data.torch_sources import (REPLAY_NOTICE, BatchFetch, IndexSource, IterableSource, LoaderReader,
                                  StatefulLoaderReader, TextCheck, as_batch, is_stateful_loader)
from ..errors import UserError
from ..hparams import HParams
from .base import Problem, ProblemSpec

__all__ = ["problem_from_data", "reader_from_data", "as_problem", "DataProblem", "MissingSplitError", "TOKEN_TASKS"]

SHUFFLE_BUFFER = 1 << 20   # larger than any in-memory dataset: a full permutation
#: tasks whose models read ``inputs`` / ``targets`` as token ids (strings there are refused)
TOKEN_TASKS = ("seq2seq", "lm", "classify")

Columns = Mapping[str, str] | Sequence[str] | None


def _kind(data: Any, split: str) -> str:
    """Which form ``data`` is (see the module table); refuses unusable data with one line."""
    if is_stateful_loader(data):
        return "stateful_loader"
    if isinstance(data, DataLoader):
        return "loader"
    if is_hf_dataset(data):
        return "hf"
    if isinstance(data, IterableDataset):
        return "iterable_dataset"
    if hasattr(data, "__len__") and hasattr(data, "__getitem__") and not isinstance(data, (str, bytes, dict)):
        return "map"
    if callable(data):
        return "function"
    if isinstance(data, Iterator):
        raise UserError(f"problem_from_data: the {split} data is a one-shot iterator; pass a list, a Dataset, "
                        "or a function that returns a fresh iterable each epoch")
    if isinstance(data, Iterable):
        return "iterable"
    raise UserError(f"problem_from_data: the {split} data is a {type(data).__name__}; expected a Dataset, "
                    "a DataLoader, a datasets.Dataset, a list, an iterable or a function returning one")


class _Checked:
    """A collate function whose batches go through :func:`as_batch` (string check included)."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None, pad_id: int, refuse: tuple[str, ...]) -> None:
        self.collate_fn, self.pad_id, self.refuse = collate_fn, pad_id, refuse

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        if self.collate_fn is not None:
            return as_batch(self.collate_fn(items), self.refuse)
        return as_batch(collate(items, self.pad_id, keep_dtypes=True), self.refuse)


def reader_from_data(data: Any, hp: HParams, *, split: str = "train", seed: int = 0, shuffle: bool | None = None,
                     workers: int = 0, spec: ProblemSpec | None = None,
                     collate_fn: Callable[[list[Any]], Any] | None = None, columns: Columns = None) -> Reader:
    """A resumable reader over ``data`` (any form of the module table); its ``notices`` say what to know.

    ``shuffle`` (default: for ``split == "train"``) and ``hp.batch_size`` apply to datasets;
    a DataLoader keeps its own sampler and batch size. ``seed`` is added to ``hp.seed``.
    """
    kind = _kind(data, split)
    pad_id = max(spec.pad_id, 0) if spec is not None else 0
    refuse = ("inputs", "targets") if spec is not None and spec.task in TOKEN_TASKS else ()
    base_seed = hp.seed + seed
    if kind == "stateful_loader":
        return StatefulLoaderReader(data, seed=base_seed, refuse_text=refuse)
    if kind == "loader":
        return LoaderReader(data, seed=base_seed, refuse_text=refuse)
    notices: list[str] = []
    if kind in ("map", "hf"):
        if kind == "hf":
            fetch: Callable[[list[int]], Any] = ArrowFetch(data, columns, pad_id)
        else:
            fetch = BatchFetch(data, collate_fn, pad_id)
        indices: Reader = IndexSource(len(data))
        if shuffle if shuffle is not None else split == "train":
            indices = indices.shuffle(SHUFFLE_BUFFER, seed=base_seed)
        reader, notices = fetch_stage(indices.batch(hp.batch_size, collate=list), fetch, workers,
                                      what=f"the {split} dataset ({type(data).__name__})")
        if refuse:
            reader = reader.map(TextCheck(refuse), rowwise=True)   # here: a one-line error, not a worker's
    else:
        if kind == "iterable_dataset":
            source: Reader = IterableSource(data)
        else:
            source = from_generator(data if kind == "function" else (lambda: iter(data)))
            notices.append(REPLAY_NOTICE.format(what=f"the {split} data ({type(data).__name__})"))
            if shuffle if shuffle is not None else split == "train":
                source = source.shuffle(SHUFFLE_BUFFER, seed=base_seed)
        reader = source.batch(hp.batch_size, collate=_Checked(collate_fn, pad_id, refuse))
    reader.notices = notices  # type: ignore[attr-defined]
    return reader


class MissingSplitError(UserError, ValueError):
    """The problem was given no data for this split (``hotloop eval`` reports it as not available)."""


class DataProblem(Problem):
    """The problem :func:`problem_from_data` returns (splits held as given, nothing to prepare)."""

    def __init__(self, splits: dict[str, Any], spec: ProblemSpec, *,
                 collate_fn: Callable[[list[Any]], Any] | None = None, columns: Columns = None) -> None:
        super().__init__()
        self.splits = {k: v for k, v in splits.items() if v is not None}
        self._spec = spec
        self.task = spec.task
        self.collate_fn, self.columns = collate_fn, columns
        self.eval_splits = tuple(s for s in ("valid", "test") if s in self.splits)[:1]

    def spec(self, hp: HParams) -> ProblemSpec:
        return self._spec

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> Reader:
        if split not in self.splits:
            raise MissingSplitError(f"problem_from_data: no {split!r} data (given: {', '.join(self.splits)})")
        return reader_from_data(self.splits[split], hp, split=split, seed=seed, shuffle=shuffle, workers=workers,
                                spec=self._spec, collate_fn=self.collate_fn, columns=self.columns)


def _derived_spec(train: Any, task: str, columns: Columns) -> ProblemSpec:
    sizes = derived_sizes(train, columns) if is_hf_dataset(train) else {}
    return ProblemSpec(task=task, **sizes)


def problem_from_data(train: Any, valid: Any = None, *, spec: ProblemSpec | None = None, test: Any = None,
                      task: str = "custom", collate_fn: Callable[[list[Any]], Any] | None = None,
                      columns: Columns = None) -> DataProblem:
    """A problem over your data (see the module doc); ``valid`` (else ``test``) is evaluated.

    ``spec`` is optional: without it the spec is ``ProblemSpec(task=task)``, with the vocabulary
    sizes and longest rows of an HF dataset's ``inputs`` / ``targets`` columns derived from the
    train data. ``collate_fn`` replaces the default collation of dataset items; ``columns``
    picks (a list) or renames (``{"inputs": "input_ids", "targets": "label"}``) an HF dataset's
    columns.
    """
    for split, data in (("train", train), ("valid", valid), ("test", test)):
        if data is not None:
            _kind(data, split)  # refuse unusable data now, not at the first batch
    if spec is None:
        spec = _derived_spec(train, task, columns)
    return DataProblem({"train": train, "valid": valid, "test": test}, spec, collate_fn=collate_fn,
                       columns=columns)


def as_problem(data: Any) -> Problem:
    """``data`` itself when it is a Problem, else :func:`problem_from_data` over it (train split)."""
    return data if isinstance(data, Problem) else problem_from_data(data)
