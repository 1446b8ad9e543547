"""Graceful stop signals: Ctrl-C (SIGINT), SIGTERM and SIGUSR1.

The first signal only records a stop request; the training loop takes it at the
next step boundary, writes a checkpoint and raises :class:`Interrupted`, whose
``exit_code`` the ``hotloop`` command exits with (128 + the signal number, as
shells and schedulers expect: 130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1).
A second signal raises :class:`Interrupted` at once, wherever the program is.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any, Callable, Sequence

__all__ = ["StopSignalGuard", "SigintGuard", "Interrupted", "STOP_SIGNALS", "exit_code_for", "signal_name"]

#: the signals that ask a run to checkpoint and stop (SIGUSR1 is absent on Windows)
STOP_SIGNALS: tuple[int, ...] = tuple(int(s) for s in (signal.SIGINT, getattr(signal, "SIGTERM", None),
                                                       getattr(signal, "SIGUSR1", None)) if s is not None)


def exit_code_for(signum: int) -> int:
    """The process exit code for a run stopped by ``signum``: ``128 + signum``."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for ``signal.SIGTERM`` (falls back to ``"signal N"``)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal; ``exit_code`` is ``128 + signum``.

    A subclass of :class:`KeyboardInterrupt`, so code that handles Ctrl-C handles it too.
    """

    def __init__(self, signum: int = int(signal.SIGINT)) -> None:
        super().__init__(signal_name(signum))
        self.signum = int(signum)
        self.exit_code = exit_code_for(signum)


class StopSignalGuard:
    """Context manager installing the two-stage handler for ``signals`` (main thread only).

    ``on_first(signum)`` is called for the first signal received; any later one raises
    :class:`Interrupted` immediately. Previous handlers are restored on exit.
    """

    def __init__(self, on_first: Callable[[int], None], signals: Sequence[int] = STOP_SIGNALS) -> None:
        self.on_first = on_first
        self.signals = tuple(signals)
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.on_first(signum)
        else:
            raise Interrupted(signum)

    def __enter__(self) -> "StopSignalGuard":
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                try:
                    self._previous[signum] = signal.signal(signum, self._handle)
                except (ValueError, OSError):  # not allowed here (e.g. embedded interpreter)
                    continue
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


class SigintGuard(StopSignalGuard):
    """Ctrl-C only: ``on_first()`` takes no argument (the original interface)."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        super().__init__(lambda signum: on_first(), (int(signal.SIGINT),))
