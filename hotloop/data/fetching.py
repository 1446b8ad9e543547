"""Run a batch-fetching function on ``workers``: worker processes when it pickles, else threads.

:func:`fetch_stage` is how :class:`~hotloop.problems.datasets.DataProblem` honours
``workers=`` (``Strategy.num_workers``): the map-style dataset's ``__getitem__`` runs in
:class:`~hotloop.data.workers.WorkerPool` processes (``Reader.map(fn, workers=N)``), or, for a
dataset that cannot be pickled (a lambda inside it, an open handle), in :class:`ThreadMap`'s
threads, with one notice saying so. Order and batches are the same either way.
"""
from __future__ import annotations

import collections
import pickle
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

from .reader import Reader

__all__ = ["ThreadMap", "fetch_stage"]


class ThreadMap(Reader):
    """``fn`` over the upstream's items in ``workers`` threads, in order (``2 * workers`` in flight)."""

    def __init__(self, upstream: Reader, fn: Callable[[Any], Any], workers: int) -> None:
        super().__init__(upstream)
        if workers < 1:
            raise ValueError(f"ThreadMap needs workers >= 1, got {workers}")
        self.fn, self.workers = fn, workers

    def _num_items(self, epoch: int) -> int | None:
        return self.upstream._num_items(epoch)

    def _iter_from(self, epoch: int, start: int) -> Iterator[Any]:
        items = self.upstream._iter_from(epoch, start)   # 1:1, so skipping never runs fn
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="hotloop-fetch")
        window: collections.deque[Future] = collections.deque()
        try:
            for item in items:
                window.append(pool.submit(self.fn, item))
                if len(window) >= 2 * self.workers:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _picklable(obj: Any) -> str | None:
    """None when ``obj`` pickles, else why not (one line)."""
    try:
        pickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any failure means: not for worker processes
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def fetch_stage(upstream: Reader, fn: Callable[[Any], Any], workers: int, what: str = "the dataset"
                ) -> tuple[Reader, list[str]]:
    """``upstream.map(fn)`` on ``workers`` processes (threads when ``fn`` does not pickle); the notices.

    ``fn`` must treat each row of its batch alone (``rowwise``): a data-parallel rank then fetches
    only its own rows (:mod:`hotloop.data.row_shard`).
    """
    if workers <= 0:
        return upstream.map(fn, rowwise=True), []
    why = _picklable(fn)
    if why is None:
        return upstream.map(fn, workers=workers, rowwise=True), []
    return ThreadMap(upstream, fn, workers), [
        f"reader: {what} cannot be pickled for worker processes ({why}); it is read in {workers} threads"]
