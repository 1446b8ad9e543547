"""A timed trial of feeding: is the chosen step faster with the prefetch thread, or reading in line?

``Strategy.prefetch > 0`` reads the next batches on a background thread while the step runs. That
pays when a batch costs enough to read and a core is free for it; on a host of few cores whose
step already uses every core, the thread takes time from the step's own threads and holds the
GIL against the step's Python dispatch, and a cheap batch read in line can cost less than that.
The rules cannot see which way it goes, so the tuner times it: the chosen strategy's step (the
winner's own built step, compiled already) is fed by the run's reader both ways, in rounds of one
block each, the order alternating; every block opens a feeder at the start of epoch 0 (the same
batches both ways), takes one warm-up step, then times ``block`` steps up to a host read of the
last loss, as the Trainer reads it. Reading in line (``prefetch=0``) is chosen only when it is
faster with 90% confidence by ``min_gain`` (:mod:`hotloop.tools.significance`); otherwise the
strategy's prefetch stays. The trial runs only in what is left of the tuning budget, and only
when reading a step's batches takes at least ``min_gain`` of the step (:func:`worth_timing`):
the thread's cost to the step is its own reading and handing over, so below that share neither
way can win by ``min_gain``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..engine.strategy import Strategy
from ..hparams import HParams
from ..problems.base import Batch, Problem, open_reader
from ..train.feeding import DataFeeder
from .isolation import applied_strategy
from .significance import MIN_PAIRS, Comparison, compare_paired
from .trials import Trial

__all__ = ["FeedTrial", "time_block", "compare_feeding", "confirm_feeding", "worth_timing", "BLOCK", "MAX_ROUNDS",
           "FEED_STEPS", "MIN_GAIN"]

BLOCK = 4            # timed steps per block
MAX_ROUNDS = 6       # rounds of one block each way
#: steps of the fewest rounds that give a verdict (both ways, warm-up included): the trials leave room for them
FEED_STEPS = 2 * (BLOCK + 1) * MIN_PAIRS
MIN_GAIN = 0.02      # reading in line must win by this share of the step


def worth_timing(reader_share: float, min_gain: float = MIN_GAIN) -> bool:
    """Whether feeding can change the step by ``min_gain``: reading a step's batches takes at least
    that share of the step (``reader_share``: seconds reading one step's batches / step seconds)."""
    return reader_share >= min_gain


@dataclass(frozen=True)
class FeedTrial:
    """What the feeding trial measured, and the prefetch it leaves."""

    prefetch: int                        # the strategy's capacity, timed against reading in line
    chosen: int                          # the prefetch the strategy keeps
    comparison: Comparison | None = None  # in line / prefetching, per round (< 1: in line faster)
    why: str = ""                        # why it was not timed

    def line(self) -> str:
        if self.comparison is None:
            return f"feeding trial: not timed ({self.why}); prefetch={self.chosen} kept"
        verdict = ("reading in line chosen (prefetch=0)" if self.chosen == 0
                   else f"prefetch={self.chosen} kept")
        return f"feeding trial: in line / prefetch={self.prefetch} {self.comparison.describe()} -> {verdict}"


StepFn = Callable[[list[Batch]], torch.Tensor]      # micro-batches -> the step's loss (on the device)


def time_block(step: StepFn, reader: Any, device: torch.device, prefetch: int, steps: int, accum: int,
               check: Callable[[], None] = lambda: None) -> float:
    """Seconds per step of ``steps`` steps fed with ``prefetch`` (0: in line), after one warm-up step."""
    feeder = DataFeeder(reader, device, prefetch)
    try:
        feeder.start_epoch(0)
        epoch = 0

        def micro() -> list[Batch]:
            nonlocal epoch
            batches = feeder.next_step(accum)
            if batches is None:                      # a short epoch: the next one
                epoch += 1
                feeder.start_epoch(epoch)
                batches = feeder.next_step(accum)
            if batches is None:
                raise ValueError("the training reader produced no batches for the feeding trial")
            return batches

        check()
        float(step(micro()))
        start = time.perf_counter()
        loss = None
        for _ in range(steps):
            check()
            loss = step(micro())
        float(loss)                                  # the step is complete when timed
        return (time.perf_counter() - start) / steps
    finally:
        feeder.close()


def compare_feeding(step: StepFn, reader: Any, device: torch.device, prefetch: int, accum: int, rounds: int, *,
                    block: int = BLOCK, check: Callable[[], None] = lambda: None) -> Comparison:
    """In line / prefetching, paired by round over ``rounds`` rounds (the order alternating)."""
    times: dict[int, list[float]] = {0: [], prefetch: []}
    for r in range(rounds):
        for mode in ((0, prefetch) if r % 2 == 0 else (prefetch, 0)):
            times[mode].append(time_block(step, reader, device, mode, block, accum, check))
    order = list(range(rounds))
    return compare_paired(times[0], order, times[prefetch], order)


def confirm_feeding(winner: Trial, trials_runner: Any, problem: Problem, hp: HParams, strategy: Strategy,
                    seconds_left: float, reader_share: float, *, min_gain: float = MIN_GAIN, block: int = BLOCK,
                    max_rounds: int = MAX_ROUNDS) -> FeedTrial:
    """Time ``winner``'s built step fed in line and with ``strategy.prefetch``; the prefetch to keep.

    ``trials_runner``: the :class:`~hotloop.tools.trials.TrialRunner` that holds the winner's step;
    ``seconds_left``: what the tuning budget has left, in which the rounds must fit;
    ``reader_share``: seconds reading one step's batches / the step's seconds (:func:`worth_timing`)."""
    prefetch = strategy.prefetch
    run = winner.runner
    if prefetch <= 0:
        return FeedTrial(prefetch, prefetch, why="the strategy reads in line already")
    if not worth_timing(reader_share, min_gain):
        return FeedTrial(prefetch, prefetch, why=f"reading is {reader_share:.1%} of the step, under the "
                                                 f"{min_gain:.0%} either way must win by")
    if run is None or not winner.step_times:
        return FeedTrial(prefetch, prefetch, why="the chosen step is not built")
    accum = max(1, hp.accum_steps)
    per_round = 2 * (block + 1) * winner.median           # both blocks and their warm-up steps
    rounds = min(max_rounds, int(seconds_left // per_round)) if per_round > 0 else 0
    if rounds < MIN_PAIRS:
        return FeedTrial(prefetch, prefetch, why=f"{seconds_left:.1f} s left of the budget, "
                                                 f"{MIN_PAIRS} rounds need {MIN_PAIRS * per_round:.1f} s")
    device = trials_runner.device

    def step(micro: list[Batch]) -> torch.Tensor:
        result = run.step(micro, run.state)
        run.state = result.state
        return result.loss

    reader = open_reader(problem, "train", hp, workers=strategy.num_workers)
    try:
        with applied_strategy(winner.strategy, device):
            comparison = compare_feeding(step, reader, device, prefetch, accum, rounds, block=block,
                                         check=trials_runner.check)
    except Exception as exc:  # noqa: BLE001 - the trial informs a choice; the run reports its own errors
        return FeedTrial(prefetch, prefetch, why=f"failed: {type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        close = getattr(reader, "close", None)
        if callable(close):
            close()
    return FeedTrial(prefetch, 0 if comparison.faster(min_gain) else prefetch, comparison)
