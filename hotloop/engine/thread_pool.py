"""Daemon threads shared by every ParallelExecutor with the same thread count."""
from __future__ import annotations

import queue
import threading

import torch

__all__ = ["WorkerThreads", "shared_pool"]


class WorkerThreads:
    """Threads that run ``executor.work(run, index)`` items from one queue."""

    def __init__(self, num_threads: int) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._loop, name=f"hotloop-exec-{i}", daemon=True)
                        for i in range(num_threads)]
        for t in self.threads:
            t.start()

    def put(self, item: tuple) -> None:
        self.queue.put(item)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # grad mode is thread-local
        while True:
            executor, run, index = self.queue.get()
            executor.work(run, index)


_POOLS: dict[int, WorkerThreads] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(num_threads: int) -> WorkerThreads:
    with _POOLS_LOCK:
        if num_threads not in _POOLS:
            _POOLS[num_threads] = WorkerThreads(num_threads)
        return _POOLS[num_threads]
