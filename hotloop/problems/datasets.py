"""Train on data you already have, without subclassing :class:`~hotloop.problems.base.Problem`.

:func:`problem_from_data` wraps a ``torch.utils.data.Dataset`` (anything with
``__len__`` and ``__getitem__``, a list included), or an iterable, or a function
returning a fresh iterable per epoch, into a problem the Trainer runs::

    problem = problem_from_data(train=my_dataset, valid=my_valid_list,
                                spec=ProblemSpec(task="seq2seq", input_vocab_size=30,
                                                 target_vocab_size=30))

Each example is a dict of arrays / lists / numbers (``{"inputs": [...], "targets": [...]}``)
or an ``(inputs, targets)`` pair. Batches hold ``hp.batch_size`` examples, padded
with ``spec.pad_id``. The train split is shuffled per epoch from the seed. Readers
are resumable: an indexable dataset resumes by index; an iterable is replayed up to
the saved position, so it must give the same items every time it is iterated (a
one-shot generator object is refused: pass the function that makes it).
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from ..data import Reader, from_generator
from ..errors import UserError
from ..hparams import HParams
from .base import Problem, ProblemSpec

__all__ = ["problem_from_data", "DataProblem", "DatasetSource"]

SHUFFLE_BUFFER = 1 << 20   # larger than any in-memory dataset: a full permutation


def _as_example(item: Any) -> Any:
    if isinstance(item, tuple) and len(item) == 2:
        return {"inputs": item[0], "targets": item[1]}
    return item


class DatasetSource(Reader):
    """A map-style dataset (``len`` + ``[i]``) as an indexable reader source."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.dataset = dataset

    @property
    def indexable(self) -> bool:
        return True

    def _num_items(self, epoch: int) -> int:
        return len(self.dataset)

    def _get(self, epoch: int, index: int) -> Any:
        return _as_example(self.dataset[index])

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        for index in range(start, len(self.dataset)):
            yield self._get(epoch, index)


def _source(data: Any, split: str) -> Reader:
    if hasattr(data, "__len__") and hasattr(data, "__getitem__") and not isinstance(data, (str, bytes, dict)):
        return DatasetSource(data)
    if callable(data):
        return from_generator(lambda: (_as_example(x) for x in data()))
    if isinstance(data, Iterator):
        raise UserError(f"problem_from_data: the {split} data is a one-shot iterator; pass a list, a Dataset, "
                        "or a function that returns a fresh iterable each epoch")
    if isinstance(data, Iterable):
        return from_generator(lambda: (_as_example(x) for x in data))
    raise UserError(f"problem_from_data: the {split} data is a {type(data).__name__}; expected a Dataset, "
                    "a list, an iterable or a function returning one")


class DataProblem(Problem):
    """The problem :func:`problem_from_data` returns (splits held in memory, nothing to prepare)."""

    def __init__(self, splits: dict[str, Any], spec: ProblemSpec) -> None:
        super().__init__()
        self.splits = {k: v for k, v in splits.items() if v is not None}
        self._spec = spec
        self.task = spec.task
        self.eval_splits = tuple(s for s in ("valid", "test") if s in self.splits)[:1]

    def spec(self, hp: HParams) -> ProblemSpec:
        return self._spec

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> Reader:
        if split not in self.splits:
            raise UserError(f"problem_from_data: no {split!r} data (given: {', '.join(self.splits)})")
        reader = _source(self.splits[split], split)
        if shuffle if shuffle is not None else split == "train":
            reader = reader.shuffle(SHUFFLE_BUFFER, seed=hp.seed + seed)
        return reader.batch(hp.batch_size, pad_id=max(self._spec.pad_id, 0))


def problem_from_data(train: Any, valid: Any = None, *, spec: ProblemSpec, test: Any = None) -> DataProblem:
    """A problem over in-memory data (see the module doc); ``valid`` (else ``test``) is evaluated."""
    for split, data in (("train", train), ("valid", valid), ("test", test)):
        if data is not None:
            _source(data, split)  # refuse unusable data now, not at the first batch
    return DataProblem({"train": train, "valid": valid, "test": test}, spec)
