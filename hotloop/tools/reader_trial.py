"""A timed trial of the reader: does ``Strategy.num_workers`` make batches faster here?

The autotuner applies a worker count only after this trial: it reads the same
training batches with no workers and with the proposed count (after one warm-up
batch each, which pays for starting the processes) and keeps the workers only
when they are faster by ``min_gain``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..hparams import HParams
from ..problems.base import Problem, open_reader

__all__ = ["ReaderTrial", "time_reader", "confirm_workers"]


@dataclass(frozen=True)
class ReaderTrial:
    workers: int                  # the proposed count
    seconds_without: float        # per batch, no workers
    seconds_with: float           # per batch, with ``workers``
    kept: bool

    def line(self) -> str:
        verdict = "kept" if self.kept else "not kept"
        return (f"reader trial: {self.workers} worker(s) {self.seconds_with * 1e3:.2f} ms/batch vs "
                f"{self.seconds_without * 1e3:.2f} ms/batch without -> {verdict}")


def time_reader(problem: Problem, hp: HParams, workers: int, batches: int) -> float:
    """Seconds per training batch over ``batches`` batches after one warm-up batch."""
    reader = open_reader(problem, "train", hp, workers=workers)
    iterator = iter(reader)
    try:
        next(iterator)
        start = time.perf_counter()
        read = 0
        for _ in range(batches):
            if next(iterator, None) is None:
                break
            read += 1
        return (time.perf_counter() - start) / max(read, 1)
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()
        close = getattr(reader, "close", None)
        if callable(close):
            close()


def confirm_workers(problem: Problem, hp: HParams, workers: int, *, batches: int = 8,
                    min_gain: float = 0.05) -> ReaderTrial:
    """Time the reader without and with ``workers``; ``kept`` when the workers win by ``min_gain``."""
    without = time_reader(problem, hp, 0, batches)
    with_workers = time_reader(problem, hp, workers, batches)
    return ReaderTrial(workers, without, with_workers, with_workers < without * (1 - min_gain))
