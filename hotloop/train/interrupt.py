"""Graceful Ctrl-C: the first SIGINT asks the loop to stop at the next step boundary
(so the checkpoint is consistent); a second one raises KeyboardInterrupt at once."""
from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any, Callable

__all__ = ["SigintGuard"]


class SigintGuard:
    """Context manager installing the two-stage SIGINT handler (main thread only)."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.on_first = on_first
        self.count = 0
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.on_first()
        else:
            raise KeyboardInterrupt

    def __enter__(self) -> "SigintGuard":
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGINT, self._handle)
                self._installed = True
            except ValueError:  # not allowed here (e.g. embedded interpreter)
                self._installed = False
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
