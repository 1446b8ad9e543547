"""When the training loop stops: limits, callback requests and stop signals.

In one process a stop signal (SIGINT, SIGTERM, SIGUSR1) is taken at the next step
boundary. In a multi-process job every rank must stop at the same step, or one
rank would wait forever in the next collective; so the ranks agree on the
*local* conditions (a signal received, ``max_time`` reached) with one small
all-reduce at each sync point: every ``sync_every`` steps (where the statistics
are read anyway, so no extra host sync is added in between) and at epoch ends.
A signal therefore stops a ``--nproc`` job within ``sync_every`` steps.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from .interrupt import STOP_SIGNALS, signal_name

__all__ = ["StopControl"]


class StopControl:
    """Holds stop requests and answers "stop now, and why?" at step boundaries."""

    def __init__(self, dist: Any, max_time: float | None = None) -> None:
        self.dist = dist
        self.max_time = max_time
        self.signum: int | None = None        # the stop signal received (or agreed on)
        self.message: str | None = None       # a callback's request_stop() reason
        self.agreed = False                   # every rank agreed on a signal in signalled()
        self.start = time.monotonic()

    def restart_clock(self) -> None:
        self.start = time.monotonic()

    def on_signal(self, signum: int) -> None:
        """Signal handler hook: only records the request (safe at any point)."""
        self.signum = int(signum)

    def request(self, reason: str) -> None:
        self.message = reason

    @property
    def signal_name(self) -> str:
        return signal_name(self.signum) if self.signum is not None else ""

    def _time_up(self) -> bool:
        return self.max_time is not None and time.monotonic() - self.start >= self.max_time

    def _agree(self) -> tuple[int | None, bool]:
        """All ranks' (signal, time-up) combined: any rank's request stops every rank."""
        local_signal = self.signum is not None
        flags = {"signal": torch.tensor(float(local_signal)),
                 "signum": torch.tensor(float(self.signum or 0)),
                 "time_up": torch.tensor(float(self._time_up()))}
        total = {k: float(v) for k, v in self.dist.all_reduce_stats(flags).items()}
        signum = None
        if total["signal"] > 0:
            mean = round(total["signum"] / total["signal"])
            signum = mean if mean in STOP_SIGNALS else int(STOP_SIGNALS[1] if len(STOP_SIGNALS) > 1 else 2)
            self.signum = signum
        return signum, total["time_up"] > 0

    def signalled(self, sync_point: bool) -> bool:
        """Whether a stop signal asks to end the current work now (evaluation: checked per batch).

        With several ranks only at ``sync_point`` (every rank asks at the same points and agrees).
        """
        if self.dist.world_size > 1:
            self.agreed = self.agreed or (sync_point and self._agree()[0] is not None)
            return self.agreed
        return self.signum is not None

    def reason(self, *, step: int, epoch: int, max_steps: int, max_epochs: int,
               sync_point: bool, epoch_boundary: bool = False) -> str | None:
        """``"interrupted"`` (a signal), ``"stopped: ..."``, a limit's name, or None to go on.

        With several ranks, signals and ``max_time`` count only at sync points (``sync_point``
        or ``epoch_boundary``), where every rank takes part in the agreement.
        """
        if self.dist.world_size > 1 and self.agreed:     # every rank took the signal (signalled())
            signum, time_up = self.signum, False
        elif self.dist.world_size > 1:
            signum, time_up = self._agree() if (sync_point or epoch_boundary) else (None, False)
        else:
            signum, time_up = self.signum, self._time_up()
        if signum is not None:
            return "interrupted"
        if self.message:
            return f"stopped: {self.message}"
        if max_steps and step >= max_steps:
            return "max_steps"
        if epoch_boundary and max_epochs and epoch >= max_epochs:
            return "max_epochs"
        if time_up:
            return "max_time"
        return None
