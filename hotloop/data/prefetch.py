"""Asynchronous feeding: a producer thread fills a bounded queue ahead of the step.

``prefetch(reader, capacity=2, device=None, double_buffer=True)`` returns a
reader-like object. Its producer thread iterates ``reader``; with
``double_buffer`` it also moves each batch to ``device`` (pinned memory and
``non_blocking=True`` on a side CUDA stream; contiguous tensors on CPU), so
the next batch is ready while the current step runs.

``state_dict()`` reflects the batches the *consumer* received, not those
produced ahead: each queued batch carries the reader state taken right after
it was produced. After a ``break`` the wrapped reader is moved back to the
consumed position, so iterating again continues exactly.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .errors import ReaderError
from .wrapper import ReaderWrapper

__all__ = ["prefetch", "Prefetcher", "SyncFeeder", "FeedStats", "to_device"]

log = logging.getLogger("hotloop.data")
POLL_S = 0.1


@dataclass
class FeedStats:
    """Per-step data wait: ``wait_s`` (last), ``total_wait_s``, ``batches``, ``qsize`` (now)."""

    wait_s: float = 0.0
    total_wait_s: float = 0.0
    batches: int = 0
    qsize: int = 0
    capacity: int = 0

    @property
    def mean_wait_s(self) -> float:
        return self.total_wait_s / max(1, self.batches)


def to_device(batch: Any, device: torch.device | None, *, pin: bool = False) -> Any:
    """Move tensors in ``batch`` (dict/tuple/list/Tensor) to ``device``; CPU: make contiguous.

    The one batch mover: the prefetcher, the feeder, evaluation and resume all use it.
    ``pin`` copies through pinned memory (asynchronously) on an accelerator.
    """
    if isinstance(batch, torch.Tensor):
        if device is None or device.type == "cpu":
            return batch.contiguous()
        if pin and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=pin)
    if isinstance(batch, dict):
        return {k: to_device(v, device, pin=pin) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device, pin=pin) for v in batch)
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            _record_stream(v, stream)


def _put(q: "queue.Queue[Any]", message: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(message, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _produce(reader: Any, q: "queue.Queue[Any]", stop: threading.Event, device: torch.device | None) -> None:
    cuda = device is not None and device.type == "cuda"
    stream = torch.cuda.Stream(device) if cuda else None
    items = iter(reader)
    try:
        for batch in items:
            state = reader.state_dict()
            event = None
            if cuda:
                with torch.cuda.stream(stream):
                    batch = to_device(batch, device, pin=True)
                    event = torch.cuda.Event()
                    event.record(stream)
            elif device is not None:
                batch = to_device(batch, device)
            if not _put(q, ("batch", batch, state, event), stop):
                return
        _put(q, ("end", reader.state_dict()), stop)
    except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
        _put(q, ("error", exc, traceback.format_exc()), stop)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _stop(stop: threading.Event, q: "queue.Queue[Any]", thread: threading.Thread, timeout: float) -> bool:
    stop.set()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            while True:
                q.get_nowait()  # unblock a producer waiting on a full queue
        except queue.Empty:
            pass
        thread.join(POLL_S)
    return not thread.is_alive()


class Prefetcher:
    """See the module docstring. Iterate once per epoch; ``close()`` or ``with`` to stop early."""

    def __init__(self, reader: Any, capacity: int = 2, device: Any = None, double_buffer: bool = True,
                 join_timeout: float = 10.0) -> None:
        if capacity < 1:
            raise ValueError(f"prefetch capacity must be >= 1, got {capacity}")
        self.reader, self.capacity = reader, capacity
        self.device = torch.device(device) if device is not None else None
        self.double_buffer = double_buffer
        self.join_timeout = join_timeout
        self._stats = FeedStats(capacity=capacity)
        self._consumed: dict[str, Any] | None = None
        self._queue: queue.Queue[Any] | None = None
        self._active: tuple[threading.Event, Any, threading.Thread] | None = None
        self._finalizer: Any = None

    @property
    def stats(self) -> FeedStats:
        self._stats.qsize = self._queue.qsize() if self._queue is not None else 0
        return self._stats

    def __len__(self) -> int:
        return len(self.reader)

    def __iter__(self) -> Iterator[Any]:
        if self._active is not None:
            raise RuntimeError("this prefetcher is already being iterated; close() it first")
        return self._consume()

    def _consume(self) -> Iterator[Any]:
        if self._active is not None:
            raise RuntimeError("this prefetcher is already being iterated; close() it first")
        produce_on = self.device if self.double_buffer else None
        stop, q = threading.Event(), queue.Queue(maxsize=self.capacity)
        thread = threading.Thread(target=_produce, args=(self.reader, q, stop, produce_on),
                                  name="hotloop-prefetch", daemon=True)
        self._consumed, self._queue = self.reader.state_dict(), q
        self._active = (stop, q, thread)
        self._finalizer = weakref.finalize(self, _stop, stop, q, thread, 1.0)
        thread.start()
        finished = False
        try:
            while True:
                start = time.perf_counter()
                message = self._next(q, thread)
                if message[0] == "end":
                    self._consumed = message[1]
                    finished = True
                    return
                if message[0] == "error":
                    exc, text = message[1], message[2]
                    if isinstance(exc, ReaderError):
                        raise type(exc)(str(exc)) from exc
                    raise ReaderError(f"the input pipeline raised {type(exc).__name__}: {exc}\n"
                                      f"original traceback (producer thread):\n{text.rstrip()}") from exc
                _, batch, state, event = message
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    _record_stream(batch, current)
                elif not self.double_buffer and self.device is not None:
                    batch = to_device(batch, self.device, pin=self.device.type == "cuda")
                self._consumed = state
                waited = time.perf_counter() - start
                self._stats.wait_s = waited
                self._stats.total_wait_s += waited
                self._stats.batches += 1
                yield batch
        finally:
            self._shutdown(restore=not finished)

    def _next(self, q: "queue.Queue[Any]", thread: threading.Thread) -> Any:
        while True:
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                if not thread.is_alive() and q.empty():
                    raise ReaderError("the prefetch producer thread stopped without a result") from None

    def _shutdown(self, restore: bool) -> None:
        if self._active is None:
            return
        stop, q, thread = self._active
        self._active, self._queue = None, None
        self._finalizer.detach()
        stopped = _stop(stop, q, thread, self.join_timeout)
        if not stopped:
            log.warning("hotloop prefetch: producer thread still busy after %.0f s (a slow map "
                        "function?); it is a daemon and ends with the process", self.join_timeout)
        elif restore and self._consumed is not None and hasattr(self.reader, "load_state_dict"):
            self.reader.load_state_dict(self._consumed)  # forget batches produced ahead

    def close(self) -> None:
        """Stop the producer (keeping the consumed position) and close the reader's workers."""
        self._shutdown(restore=True)
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """The reader state after the last batch the consumer received."""
        if self._active is not None and self._consumed is not None:
            return dict(self._consumed)
        return self.reader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._active is not None:
            raise RuntimeError("cannot load a state while the prefetcher is iterating; close() it first")
        self.reader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        if self._active is not None:
            raise RuntimeError("cannot set the epoch while the prefetcher is iterating")
        self.reader.set_epoch(epoch)


class SyncFeeder(ReaderWrapper):
    """``capacity=0``: the same interface without a thread (device copy in the step's thread)."""

    def __init__(self, reader: Any, device: Any = None) -> None:
        self.reader = reader
        self.device = torch.device(device) if device is not None else None
        self._stats = FeedStats()

    @property
    def stats(self) -> FeedStats:
        return self._stats

    def __len__(self) -> int:
        return len(self.reader)

    def __iter__(self) -> Iterator[Any]:
        items = iter(self.reader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(items)
            except StopIteration:
                return
            batch = to_device(batch, self.device)
            waited = time.perf_counter() - start
            self._stats.wait_s, self._stats.batches = waited, self._stats.batches + 1
            self._stats.total_wait_s += waited
            yield batch



def prefetch(reader: Any, capacity: int = 2, device: Any = None, double_buffer: bool = True) -> Any:
    """Feed ``reader`` asynchronously (``capacity`` batches ahead; 0 = synchronous).

    Compute-only throughput (``Strategy.speed_test``) is the feeder's switch
    (:class:`hotloop.train.feeding.DataFeeder`, :func:`hotloop.data.speedtest.speed_test`).
    """
    if capacity == 0:
        return SyncFeeder(reader, device)
    return Prefetcher(reader, capacity=capacity, device=device, double_buffer=double_buffer)
