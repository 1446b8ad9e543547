"""The order of the timed trials: each eager proposal alone, then what measured faster, combined.

Stage one times every proposal that compiles nothing (``compile_cost == 0``) alone, interleaved
with the eager reference. Stage two combines the ones whose paired ratio to eager came out
below 1 (:func:`faster_labels`): that combination (``all faster``), then each compiling
backend on top of it (``all faster + backend=...``, in the rules' order: inductor first), then
each backend alone. The combination is timed to the end, in rounds of its own, before the first
compile starts, so a compile that takes longer than its price cannot leave it unmeasured.
A proposal that measured slower alone never enters a combination, so one slow setting (a thread
count, a layout the model does not like) cannot hide the gain of the others.

With one timed proposal there is one stage; with none that compiles nothing, stage one times
the backends alone and stage two has nothing left to time.
"""
from __future__ import annotations

from typing import Sequence

from ..engine.strategy import Strategy
from .proposals import Proposal, combine
from .significance import compare_paired
from .trials import Budget, Trial, TrialRunner

__all__ = ["ALL_FASTER", "stage_one", "stage_two", "faster_labels", "run_in_stages"]

ALL_FASTER = "all faster"


def stage_one(timed: Sequence[Proposal]) -> list[Proposal]:
    """The proposals timed alone first: every one that compiles nothing (all of them if one)."""
    eager = [p for p in timed if p.compile_cost == 0]
    return list(timed) if len(timed) < 2 or not eager else eager


def stage_two(timed: Sequence[Proposal], faster: Sequence[str]) -> list[Proposal]:
    """After stage one: the faster eager proposals combined, each backend on top, each backend alone."""
    eager = [p for p in timed if p.compile_cost == 0 and p.label in faster]
    compiling = [p for p in timed if p.compile_cost > 0]      # in the rules' order: inductor first
    out = [c for c in [combine(eager, ALL_FASTER)] if c is not None]
    for backend in compiling:
        on_top = combine([backend] + eager, f"{ALL_FASTER} + {backend.label}")
        out.append(on_top if on_top is not None else backend)
    out += [b for b in compiling if eager]          # alone (when it was not alone already)
    return out


def faster_labels(trials: Sequence[Trial], reference: Trial) -> list[str]:
    """Labels of the measured trials whose paired ratio to ``reference`` is below 1."""
    out = []
    for t in trials:
        if t.measured and t is not reference:
            ratio = compare_paired(t.step_times, t.step_rounds, reference.step_times, reference.step_rounds).ratio
            if ratio < 1.0:
                out.append(t.label)
    return out


def run_in_stages(runner: TrialRunner, timed: Sequence[Proposal], reference: Trial, base: Strategy, steps: int,
                  budget: Budget, *, reserve_steps: int = 0) -> list[Trial]:
    """Both stages through ``runner`` under one ``budget``; every trial, stage one's first.

    ``base``: the reference's Strategy, to which each proposal is applied. A stage-two candidate
    whose Strategy stage one already timed is not timed again."""
    def trials_of(proposals: Sequence[Proposal]) -> list[Trial]:
        return [Trial(p.label, p.apply(base), p.rule, compile_cost=p.compile_cost) for p in proposals]

    done = runner.run_candidates(trials_of(stage_one(timed)), reference, steps, budget, reserve_steps=reserve_steps)
    if len(timed) < 2:
        return done
    seen = {t.strategy for t in done} | {reference.strategy}
    second = [t for t in trials_of(stage_two(timed, faster_labels(done, reference))) if t.strategy not in seen]
    # the eager combination is timed to the end before any compile starts: a compile that runs
    # past its price would otherwise take the rounds the combination needs
    for part in ([t for t in second if t.compile_cost == 0], [t for t in second if t.compile_cost > 0]):
        if part:
            done += runner.run_candidates(part, reference, steps, budget, reserve_steps=reserve_steps)
    return done
