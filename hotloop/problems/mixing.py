"""Readers that serve several problems in one run: task tags, mixing schedules, chains.

- :func:`mixing_probabilities` turns a schedule (``proportional`` to dataset size,
  fixed ``rates``, ``temperature`` sampling, ``uniform``) into one probability per task.
- :class:`MixingReader` yields each training batch from ONE task drawn by that
  schedule. The draws of epoch ``e`` are ``default_rng([seed, e]).choice(...)``, so
  ``{"epoch", "index"}`` plus every sub-reader's own state (and the epoch it is in)
  is the whole position: ``state_dict`` / ``load_state_dict`` resume bitwise. A task
  whose reader runs out starts its next epoch; tasks cycle independently.
- :class:`TaggedReader` adds the task tag to each batch of one task's reader.
- :class:`ChainReader` reads several readers one after the other (all tasks' eval data).

The tag is a batch entry ``"task:<name>"`` holding the task index (int64 ``[1]``).
The step capture keys its graphs on the batch's keys and shapes, not on values, so
the task's name in the key gives every task its own capture, and the model can pick
the task's modules from the key without reading a device value.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..data.wrapper import ReaderWrapper
from ..errors import UserError
from .base import Batch, BatchReader

__all__ = ["TASK_PREFIX", "MIXING_MODES", "task_key", "task_of", "tag_batch", "mixing_probabilities",
           "reader_size", "TaggedReader", "MixingReader", "ChainReader"]

TASK_PREFIX = "task:"
MIXING_MODES = ("proportional", "rates", "temperature", "uniform")


def task_key(name: str) -> str:
    """The batch key that tags a batch of task ``name``."""
    return TASK_PREFIX + name


def task_of(batch: Batch) -> str:
    """The task name a batch is tagged with (exactly one ``task:<name>`` key)."""
    names = [k[len(TASK_PREFIX):] for k in batch if k.startswith(TASK_PREFIX)]
    if len(names) != 1:
        raise KeyError(f"a multi-problem batch carries one {TASK_PREFIX}<name> key; this one has "
                       f"keys {sorted(batch)}")
    return names[0]


def tag_batch(batch: Batch, name: str, index: int) -> Batch:
    """``batch`` plus ``task:<name>`` = int64 ``[1]`` holding ``index``."""
    return {**batch, task_key(name): torch.tensor([index], dtype=torch.int64)}


def mixing_probabilities(mode: str, sizes: Sequence[int], rates: Sequence[float] = (),
                         temperature: float = 1.0) -> np.ndarray:
    """One probability per task: ``proportional`` to ``sizes`` (batches per epoch), the given
    ``rates`` (normalised), ``temperature`` (``size ** (1 / temperature)``, normalised; 1 is
    proportional, large values approach uniform) or ``uniform``."""
    n = len(sizes)
    if mode == "proportional":
        weights = np.asarray(sizes, dtype=np.float64)
    elif mode == "uniform":
        weights = np.ones(n)
    elif mode == "temperature":
        if not temperature > 0:
            raise UserError(f"mixing_temperature must be > 0, got {temperature}")
        weights = np.asarray(sizes, dtype=np.float64) ** (1.0 / temperature)
    elif mode == "rates":
        if len(rates) != n:
            raise UserError(f"mixing=rates needs one rate per problem ({n}), got mixing_rates={tuple(rates)} "
                            f"(write them as mixing_rates=0.5:0.3:0.2)")
        weights = np.asarray(rates, dtype=np.float64)
        if (weights < 0).any():
            raise UserError(f"mixing_rates must be >= 0, got {tuple(rates)}")
    else:
        raise UserError(f"unknown mixing schedule {mode!r}; use one of {', '.join(MIXING_MODES)}")
    if not weights.sum() > 0:
        raise UserError(f"mixing={mode}: the weights {weights.tolist()} sum to zero")
    return weights / weights.sum()


def reader_size(reader: BatchReader) -> int:
    """Batches in one epoch of ``reader``: ``len()`` when known, else counted by one pass
    (the reader is put back where it was)."""
    try:
        return len(reader)  # type: ignore[arg-type]
    except TypeError:
        pass
    start = reader.state_dict()
    count = sum(1 for _ in reader)
    reader.load_state_dict(start)
    return count


class TaggedReader(ReaderWrapper):
    """``reader``'s batches tagged with task ``name`` (index ``index``); position is ``reader``'s."""

    def __init__(self, reader: BatchReader, name: str, index: int) -> None:
        self.reader, self.name, self.index = reader, name, index

    def __len__(self) -> int:
        return len(self.reader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.reader:
            yield tag_batch(batch, self.name, self.index)


class MixingReader:
    """One epoch = ``epoch_steps`` batches, each from the task the schedule draws (see module doc)."""

    def __init__(self, readers: Sequence[BatchReader], names: Sequence[str], probabilities: Sequence[float],
                 *, seed: int, epoch_steps: int) -> None:
        if len(readers) != len(names) or len(names) != len(probabilities) or not names:
            raise ValueError("MixingReader needs one name and one probability per reader")
        if epoch_steps < 1:
            raise ValueError(f"epoch_steps must be >= 1, got {epoch_steps}")
        self.readers, self.names = list(readers), list(names)
        self.probabilities = np.asarray(probabilities, dtype=np.float64)
        self.seed, self.epoch_steps = int(seed), int(epoch_steps)
        self.epoch, self.index = 0, 0
        self.sub_epochs = [0] * len(self.readers)
        self._iters: list[Iterator[Batch] | None] = [None] * len(self.readers)
        self._schedule: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.epoch_steps

    def schedule(self, epoch: int) -> np.ndarray:
        """The task index of every batch of ``epoch`` (int64 ``[epoch_steps]``)."""
        if self._schedule is None or self._schedule[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            draws = rng.choice(len(self.readers), size=self.epoch_steps, p=self.probabilities)
            self._schedule = (epoch, draws.astype(np.int64))
        return self._schedule[1]

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        order = self.schedule(epoch)
        while self.index < self.epoch_steps:
            task = int(order[self.index])
            batch = self._next_from(task)
            self.index += 1
            yield tag_batch(batch, self.names[task], task)
        if self.epoch == epoch:
            self.epoch, self.index = epoch + 1, 0

    def _next_from(self, task: int) -> Batch:
        for _ in range(2):
            it = self._iters[task]
            if it is None:
                it = self._iters[task] = iter(self.readers[task])
            batch = next(it, None)
            if batch is not None:
                return batch
            self.sub_epochs[task] += 1          # this task's epoch is over: start its next one
            self.readers[task].set_epoch(self.sub_epochs[task])
            self._iters[task] = None
        raise ValueError(f"problem {self.names[task]!r}: its train reader yields no batches")

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.index = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "sub_epochs": list(self.sub_epochs),
                "readers": [r.state_dict() for r in self.readers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["readers"]) != len(self.readers):
            raise ValueError(f"mixing reader state has {len(state['readers'])} tasks, this run has "
                             f"{len(self.readers)} ({', '.join(self.names)})")
        self._close_iterators()
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.sub_epochs = [int(e) for e in state["sub_epochs"]]
        for reader, sub in zip(self.readers, state["readers"]):
            reader.load_state_dict(sub)

    def _close_iterators(self) -> None:
        for i, it in enumerate(self._iters):
            close = getattr(it, "close", None)
            if close is not None:
                close()
            self._iters[i] = None

    def close(self) -> None:
        """Stop every task reader's workers."""
        self._close_iterators()
        for reader in self.readers:
            close = getattr(reader, "close", None)
            if close is not None:
                close()


class ChainReader:
    """``readers`` one after the other; position ``{"part", "state"}`` (the current part's state)."""

    def __init__(self, readers: Sequence[BatchReader]) -> None:
        self.readers = list(readers)
        self.part = 0
        self._starts = [r.state_dict() for r in self.readers]

    def __len__(self) -> int:
        return sum(len(r) for r in self.readers)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Batch]:
        while self.part < len(self.readers):
            yield from self.readers[self.part]
            self.part += 1
            if self.part < len(self.readers):
                self.readers[self.part].load_state_dict(self._starts[self.part])
        self.part = 0
        self.readers[0].load_state_dict(self._starts[0])

    def set_epoch(self, epoch: int) -> None:
        for reader in self.readers:
            reader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"part": self.part, "state": self.readers[self.part].state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.part = int(state["part"])
        self.readers[self.part].load_state_dict(state["state"])

    def close(self) -> None:
        for reader in self.readers:
            close = getattr(reader, "close", None)
            if close is not None:
                close()
