"""The zoo's contenders as loops (hotloop's Trainer step and feeder; the endless feeds of the naive and
expert loops), their timed blocks, the untimed steps that carry every contender to the quality
horizon and the loss compared there (``benchmarks/zoo.py --quality-steps``, ``--quality-window``).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, ContextManager

import torch

from hotloop.data import to_device
from hotloop.engine import Strategy, build_step
from hotloop.problems.base import open_reader
from hotloop.train.feeding import DataFeeder

__all__ = ["Endless", "HotloopLoop", "timed_block", "window_loss", "train_untimed"]


class Endless:
    """Batches of ``reader`` forever (next epoch when one ends), on ``device`` (through pinned
    memory, asynchronously, when ``pin``)."""

    def __init__(self, reader: Any, device: torch.device, pin: bool = False) -> None:
        self.reader, self.device, self.pin, self.epoch = reader, device, pin, 0
        self.it = iter(reader)

    def next(self) -> dict[str, torch.Tensor]:
        batch = next(self.it, None)
        if batch is None:
            self.epoch += 1
            self.reader.set_epoch(self.epoch)
            self.it = iter(self.reader)
            batch = next(self.it)
        return to_device(batch, self.device, pin=self.pin)

    def close(self) -> None:
        """End the reader's worker processes, if it has any."""
        close = getattr(self.reader, "close", None)
        if callable(close):
            close()


class HotloopLoop:
    """The Trainer's step and feeder under the auto strategy; the loss is read every sync_every steps."""

    def __init__(self, model: torch.nn.Module, run: Any, strategy: Strategy, device: torch.device) -> None:
        self.strategy, self.device = strategy, device
        self.built = build_step(model.train(), run.hp, strategy)
        reader = open_reader(run.problem, "train", run.hp, workers=strategy.num_workers)
        self.feeder = DataFeeder(reader, device, strategy.prefetch)
        self.epoch = 0
        self.feeder.start_epoch(0)
        self.pending: list[torch.Tensor] = []
        self.losses: list[float] = []
        self.accum = max(1, run.hp.accum_steps)

    def step(self) -> None:
        batches = self.feeder.next_step(self.accum)
        if batches is None:
            self.feeder.finish_epoch()
            self.epoch += 1
            self.feeder.start_epoch(self.epoch)
            batches = self.feeder.next_step(self.accum)
        result = self.built.step(batches)
        self.pending.append(result.loss)
        if len(self.pending) >= self.strategy.sync_every:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.losses += [float(x) for x in torch.stack(self.pending).tolist()]
            self.pending.clear()

    def close(self) -> None:
        self.feeder.close()


def _run(loop: Any, steps: int) -> None:
    """``steps`` steps of ``loop``, their losses read back at the end."""
    for _ in range(steps):
        loop.step()
    loop.flush()


def timed_block(loop: Any, steps: int, device: torch.device,
                flags: Callable[[], ContextManager[None]] | None = None) -> float:
    """Seconds per step of ``steps`` steps (under ``flags``), the block's losses read back at its end."""
    with flags() if flags else contextlib.nullcontext():
        start = time.perf_counter()
        _run(loop, steps)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / steps


def train_untimed(loop: Any, steps: int, flags: Callable[[], ContextManager[None]] | None = None) -> None:
    """``steps`` more steps of ``loop``, untimed (under ``flags``), their losses read back."""
    with flags() if flags else contextlib.nullcontext():
        _run(loop, steps)


def window_loss(losses: list[float], window: int) -> float:
    """The mean loss over the last ``window`` steps."""
    return statistics.mean(losses[-window:])
