"""The statistics of the steps since the last log row, read with one host sync.

:class:`LogWindow` sums each step's device-side statistics (no sync) and, when the
trainer logs, reads them once and turns them into the row that loggers receive:
step, epoch, loss, ppl, lr, tokens/s, examples/s, data fraction, grad norm, time.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from torch import Tensor

from .metrics import StatsAccumulator, summarize

__all__ = ["LogWindow"]


class LogWindow:
    """Device-side sums of the steps since the last row, plus their wall and data-wait time."""

    def __init__(self) -> None:
        self.sums = StatsAccumulator()
        self.steps = 0
        self.start = time.perf_counter()
        self.data_time_at_start = 0.0

    @property
    def host_syncs(self) -> int:
        return self.sums.host_syncs

    def restart(self, data_time: float) -> None:
        """Begin a new window now; ``data_time`` is the feeder's running data-wait total."""
        self.start, self.data_time_at_start, self.steps = time.perf_counter(), data_time, 0

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` of work that is not training (an evaluation) out of this window's wall time."""
        self.start += seconds

    def add_step(self, stats: dict[str, Tensor], loss: Tensor, grad_norm: Tensor | None,
                 nonfinite: Tensor | None = None) -> None:
        """Add one optimizer step's statistics (tensors; nothing is read); ``nonfinite`` is the
        step's ``[]`` bool "not finite" flag (counted as ``nonfinite_steps`` in the row: the ranks' flags
        summed over the window and divided by the world size, rounded up, so a step that every rank
        flags counts once and a step that one rank flags still counts)."""
        self.sums.add(stats)
        extra = {"_loss_sum": loss}
        if grad_norm is not None:
            extra["_grad_norm_sum"] = grad_norm
        if nonfinite is not None:
            extra["_nonfinite"] = nonfinite.float()
        self.sums.add(extra)
        self.steps += 1

    def read_row(self, *, step: int, epoch: int, lr: float, data_time: float, world_size: int,
                 reduce: Callable[[dict[str, Tensor]], dict[str, Tensor]], elapsed: float) -> dict[str, Any]:
        """Read the sums (the one host sync), build the log row and start the next window."""
        steps = self.steps
        sums = self.sums.read(reduce)
        wall = max(time.perf_counter() - self.start, 1e-9)
        waited = data_time - self.data_time_at_start
        self.restart(data_time)
        metrics = summarize(sums)
        row: dict[str, Any] = {"step": step, "epoch": epoch,
                               "loss": metrics.get("loss", sums.get("_loss_sum", math.nan) / max(steps, 1)),
                               "ppl": metrics.get("ppl", math.nan), "lr": lr}
        if "tokens" in sums:
            row["tokens_per_s"] = sums["tokens"] / wall
        if "examples" in sums:
            row["examples_per_s"] = sums["examples"] / wall
        row["data_fraction"] = min(1.0, waited / wall)
        if "_grad_norm_sum" in sums:
            row["grad_norm"] = sums["_grad_norm_sum"] / max(steps, 1) / world_size
        if "_nonfinite" in sums:   # summed over ranks: a step every rank flags (shared gradients) counts once
            row["nonfinite_steps"] = math.ceil(int(round(sums["_nonfinite"])) / world_size)
        row["time"] = elapsed
        return row
