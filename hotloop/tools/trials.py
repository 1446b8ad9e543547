"""Short, interleaved, timed training trials of candidate strategies on real batches.

Every candidate trains its own copy of the *same* initial weights on the
*same* batch sequence with its own copy of the *same* random stream (so
dropout draws the same masks in every candidate however the rounds interleave),
one step per round in round-robin order (so load from
other processes hits all candidates alike); per-step times after warm-up give
a median, and the per-step losses feed the parity guard. A :class:`Budget`
bounds the wall time; candidates that do not fit are skipped, never run.
"""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..engine.build import build_step
from ..engine.strategy import Strategy, StrategyError, validate_for_model
from ..hparams import HParams
from ..problems.base import Batch
from .isolation import applied_strategy, restore_rng, snapshot_rng
from .model_facts import initial_state_for

__all__ = ["Budget", "Trial", "TrialRunner", "MIN_MEASURED"]

MIN_MEASURED = 3        # measured steps a candidate needs to be compared


class Budget:
    """Wall-clock allowance in seconds, counted from construction; with ``shrinks_to``, the smaller of
    ``seconds`` and what that function gives now (a share of the run priced at the fastest step seen)."""

    def __init__(self, seconds: float, clock: Callable[[], float] | None = None, *,
                 shrinks_to: Callable[[], float] | None = None) -> None:
        self.cap = max(0.0, float(seconds))
        self.shrinks_to = shrinks_to
        self.clock = clock or time.perf_counter
        self.start = self.clock()

    @property
    def seconds(self) -> float:
        return self.cap if self.shrinks_to is None else min(self.cap, max(0.0, self.shrinks_to()))

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        return self.seconds - self.elapsed()


@dataclass
class Trial:
    """One candidate: its strategy, where it came from, and what was measured."""

    label: str
    strategy: Strategy
    rule: str
    compile_cost: float = 0.0
    warmup: int | None = None            # warm-up steps for this trial (None: the runner's)
    status: str = "pending"              # pending | ok | unsupported: .. | failed: .. | skipped: ..
    parity: str = ""                     # reference | ok (..) | REJECTED (..) | n/a
    comparison: str = ""                 # against eager: ratio, confidence bound, pairs (significance)
    step_times: list[float] = field(default_factory=list)   # seconds, warm-up excluded
    step_rounds: list[int] = field(default_factory=list)    # round of each measured step (-1: not interleaved)
    warmup_times: list[float] = field(default_factory=list)  # seconds of the warm-up steps
    losses: list[float] = field(default_factory=list)       # every step, warm-up included
    steps_run: int = 0
    runner: Any = field(default=None, repr=False)

    @property
    def median(self) -> float:
        return statistics.median(self.step_times) if self.step_times else float("inf")

    def own_estimate(self, fallback: float) -> float:
        """Seconds per step as seen so far: measured median, else the last warm-up step after the
        first (the first carries one-time costs: kernel primitives, capture, compilation), else
        ``fallback``."""
        if self.step_times:
            return self.median
        return self.warmup_times[-1] if len(self.warmup_times) > 1 else fallback

    @property
    def measured(self) -> bool:
        return self.status == "ok" and bool(self.step_times)


class _CandidateRun:
    """A candidate's private model copy, optimizer, compiled step, stream position and RNG stream."""

    def __init__(self, pristine: nn.Module, hp: HParams, strategy: Strategy,
                 device: torch.device, first_batch: Batch, rng: dict) -> None:
        self.rng = rng
        self.model = copy.deepcopy(pristine).train()
        self.step = build_step(self.model, hp, strategy).step
        self.state = initial_state_for(self.model, first_batch, device)
        self.position = 0


class TrialRunner:
    """Runs candidates over ``batches`` (already on ``device``), counting every timed step."""

    def __init__(self, pristine: nn.Module, hp: HParams, batches: Sequence[Batch],
                 device: torch.device, *, warmup: int = 2, check: Callable[[], None] = lambda: None) -> None:
        if not batches:
            raise ValueError("trials need at least one batch")
        self.pristine = pristine
        self.hp = hp
        self.batches = list(batches)
        self.device = device
        self.warmup = warmup
        self.accum = max(1, hp.accum_steps)
        self.step_calls = 0                  # every step run by this runner (the budget test counts these)
        self.round = -1                      # the interleaved round being stepped (-1: none)
        self.rounds_started = 0              # rounds so far, over every run_candidates call
        self.rng_start = snapshot_rng()       # every candidate's random streams start here
        self.check = check                    # called before every step: raises to stop tuning (a signal)
        self.prepared: list[Trial] = []      # every trial built here, in order

    def prepare(self, trial: Trial) -> bool:
        """Validate and build a candidate; False (with ``trial.status`` set) if it cannot run."""
        try:
            trial.strategy.validate(self.device)
            validate_for_model(trial.strategy, self.pristine)
            trial.runner = _CandidateRun(self.pristine, self.hp, trial.strategy, self.device,
                                         self.batches[0], self.rng_start)
        except (StrategyError, NotImplementedError) as exc:
            trial.status = f"unsupported: {exc}"
            return False
        trial.status = "ok"
        self.prepared.append(trial)
        return True

    def _micro_batches(self, run: _CandidateRun) -> list[Batch]:
        out = []
        for _ in range(self.accum):
            out.append(self.batches[run.position % len(self.batches)])
            run.position += 1
        return out

    def step(self, trial: Trial) -> float:
        """One timed optimizer step of ``trial``; returns its seconds (inf on failure)."""
        self.check()
        run: _CandidateRun = trial.runner
        micro = self._micro_batches(run)
        self.step_calls += 1
        try:
            with applied_strategy(trial.strategy, self.device):
                restore_rng(run.rng)
                start = time.perf_counter()
                result = run.step(micro, run.state)
                loss = float(result.loss)        # host read: the step is complete when timed
                seconds = time.perf_counter() - start
                run.rng = snapshot_rng()
        except Exception as exc:  # a candidate that crashes is reported, never chosen
            trial.status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            trial.runner = None
            return float("inf")
        run.state = result.state
        fallback = getattr(run.step, "fallback_reason", None)
        if fallback and trial.strategy.backend != "eager":   # it is eager in disguise: not a candidate
            trial.status = f"fell back to eager: {fallback}"
            trial.runner = None
            return seconds
        self.record(trial, loss, seconds)
        return seconds

    def record(self, trial: Trial, loss: float, seconds: float) -> None:
        """File one finished step of ``trial``: a warm-up step, or a measured one of this round."""
        trial.losses.append(loss)
        if trial.steps_run >= (self.warmup if trial.warmup is None else trial.warmup):
            trial.step_times.append(seconds)
            trial.step_rounds.append(self.round)
        else:
            trial.warmup_times.append(seconds)
        trial.steps_run += 1

    def fastest_step(self, fallback: float) -> float:
        """The lowest median step of the trials measured at least ``MIN_MEASURED`` times, else ``fallback``."""
        medians = [t.median for t in self.prepared if t.status == "ok" and len(t.step_times) >= MIN_MEASURED]
        return min(medians + [fallback])

    def typical_step(self, trials: Sequence[Trial]) -> float:
        """Median of the measured candidates' median step times (the cost model for admission)."""
        medians = [t.median for t in trials if t.measured]
        return statistics.median(medians) if medians else float("inf")

    def run_candidates(self, pending: list[Trial], reference: Trial, steps: int, budget: Budget, *,
                       reserve_steps: int = 0) -> list[Trial]:
        """Admit candidates (in order) that fit the budget and time them interleaved with ``reference``.

        A candidate is admitted only when there is room for one probe step priced at the typical measured
        step (eager's, until candidates are measured) plus the compile cost (and, while a cheap
        candidate waits in the queue, a compiling candidate needs twice its cost plus MIN_MEASURED
        steps, so a short budget is not spent on one capture),
        on top of the remaining steps of the live candidates priced at their
        own observed times (so a pathologically slow baseline does not starve
        fast candidates, and a slow candidate does not overrun the budget).
        Rounds stop early enough to leave ``reserve_steps`` steps for the parity
        check, half priced at the fastest candidate's step and half at the reference's.
        Each round steps every live candidate once; ``reference`` joins while
        it has fewer measured steps in this call's rounds than the most-measured live candidate and
        its step fits the budget after the live candidates' steps up to
        MIN_MEASURED, so comparisons stay interleaved when affordable. The order rotates every round;
        round numbers go on from the previous call's, so a later call's steps pair with its own.
        Candidates never admitted get ``status`` "skipped: ...". A candidate that an earlier call
        measured (its runner still held) goes on from its own model, stream and step count: its
        steps up to ``warm-up + steps`` are more measured steps.
        """
        target = self.warmup + steps
        queue, live, done = list(pending), [], []
        rounds = first_round = self.rounds_started     # a later call numbers its rounds on
        while True:
            est = self.typical_step([reference] + live + done)
            if est == float("inf") and reference.warmup_times:   # nothing measured: eager's last step
                est = reference.warmup_times[-1]
            for cand in list(queue):                 # in priority order; a costly one does not block the rest
                # live candidates still owe their remaining steps, and their compile cost if never stepped
                unfinished = sum((target - t.steps_run) * t.own_estimate(est)
                                 + (t.compile_cost if t.steps_run == 0 else 0.0) for t in live)
                need = est + cand.compile_cost
                if need + unfinished > budget.remaining():   # its first step would pass the budget
                    continue
                # compiling candidates, together, must leave at least half the budget to the cheap
                # ones still waiting to be admitted (none: a compile may take what is left)
                compiling = sum(t.compile_cost for t in live if t.steps_run == 0)
                share = 2 if any(not t.compile_cost for t in queue if t is not cand) else 1
                if cand.compile_cost and share * (compiling + cand.compile_cost
                                                  + (target - steps + MIN_MEASURED) * est) > budget.remaining():
                    continue
                queue.remove(cand)
                # a trial measured in an earlier call goes on with its own model and stream
                (live if cand.runner is not None or self.prepare(cand) else done).append(cand)
            active = [t for t in live if t.status == "ok" and t.steps_run < target]
            done += [t for t in live if t not in active]
            live = active
            # keep room for the parity check of the winner: it steps the reference and the
            # winner alike, so half its steps are priced at each (the fastest step stands in)
            seen = [t.own_estimate(est) for t in live if t.step_times or t.warmup_times]
            parity_step = (min(seen) + reference.own_estimate(est)) / 2 if seen else 0.0
            # the next round priced at each member's own steady step (a round's wall time would
            # count the one-time costs of first steps again)
            next_round = sum(t.own_estimate(est) for t in live)
            if not live or budget.remaining() - reserve_steps * parity_step < next_round:
                break
            most = max(len(t.step_times) for t in live)
            # candidates reaching MIN_MEASURED come first; the reference joins when that still fits
            to_minimum = sum(max(1, self.warmup + MIN_MEASURED - t.steps_run) * t.own_estimate(est) for t in live)
            interleaved = sum(1 for r in reference.step_rounds if r >= first_round)   # pairable, this call
            joins = (reference.status == "ok" and interleaved < max(most, 1) and interleaved < steps
                     and reference.own_estimate(est) + to_minimum <= budget.remaining() - reserve_steps * parity_step)
            members = ([reference] if joins else []) + live
            shift = rounds % len(members)
            members = members[shift:] + members[:shift]
            self.round, rounds = rounds, rounds + 1    # steps of one round are paired in the comparison
            for trial in members:
                if trial.own_estimate(est) > budget.remaining():   # no step is started past the budget
                    break
                self.step(trial)
            self.round = -1
        self.rounds_started = rounds
        for trial in queue:
            if trial.runner is None:           # never run (one measured earlier keeps its status)
                trial.status = "skipped: does not fit the tuning budget"
        for trial in live:
            if len(trial.step_times) < MIN_MEASURED:
                trial.status = f"incomplete: budget ended after {len(trial.step_times)} measured steps"
        return done + live + queue

    def release(self, trials: list[Trial]) -> None:
        for trial in trials:
            trial.runner = None
