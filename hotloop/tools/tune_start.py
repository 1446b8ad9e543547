"""The start of a tuning run: batches read as the budget allows, and stop signals taken between trials.

:class:`BatchStream` reads training batches on demand, so the tuner reads one step's batches,
times eager's first step on them and only then reads the rest (a run whose first step already
exceeds the budget reads no more). :class:`TuneStops` takes SIGINT/SIGTERM/SIGUSR1 while
tuning: the first signal is recorded and :meth:`TuneStops.check` (called before every trial
step) raises :class:`~hotloop.train.interrupt.Interrupted`, whose ``exit_code`` the ``hotloop``
command exits with (130, 143, 138); a second signal raises at once.
"""
from __future__ import annotations

import statistics
import time
from types import TracebackType
from typing import Any, Callable

import torch

from ..hparams import HParams
from ..problems.base import Batch, Problem
from ..train.interrupt import Interrupted, StopSignalGuard

__all__ = ["BatchStream", "TuneStops"]


class BatchStream:
    """Training batches of ``problem`` moved to ``device``, read when asked for (``close()`` at the end)."""

    def __init__(self, problem: Problem, hp: HParams, device: torch.device,
                 check: Callable[[], None] = lambda: None) -> None:
        self.problem, self.device, self.check = problem, device, check
        self.reader = problem.reader("train", hp)
        self.iterator = iter(self.reader)
        self.times: list[float] = []        # seconds of each batch read
        self.exhausted = False

    def take(self, count: int, keep_reading: Callable[[], bool] = lambda: True) -> list[Batch]:
        """Up to ``count`` more batches; stops early at the epoch's end or when ``keep_reading()`` is False."""
        out: list[Batch] = []
        while len(out) < count and not self.exhausted and (not out or keep_reading()):
            self.check()
            start = time.perf_counter()
            try:
                batch = next(self.iterator)
            except StopIteration:
                self.exhausted = True
                break
            self.times.append(time.perf_counter() - start)
            out.append({k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        return out

    def seconds_per_batch(self) -> float:
        """Median seconds per batch, the first read excluded when there are more (it opens the data)."""
        steady = self.times[1:] or self.times
        return statistics.median(steady) if steady else 0.0

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if callable(close):
            close()


class TuneStops:
    """Stop signals during tuning: the first is recorded, :meth:`check` raises it (main thread only)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._guard = StopSignalGuard(self._record)

    def _record(self, signum: int) -> None:
        self.signum = int(signum)

    def check(self) -> None:
        """Raise :class:`Interrupted` if a stop signal arrived (between trial steps and batch reads)."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def __enter__(self) -> "TuneStops":
        self._guard.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Any:
        self._guard.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self.check()            # a signal taken after the last trial step still stops the run
        return None
