"""The order of the timed trials: each eager proposal alone, then what measured faster, combined.

Stage one times every proposal that compiles nothing (``compile_cost == 0``) alone, interleaved
with the eager reference. Stage two combines the ones whose paired ratio to eager came out
below 1 (:func:`faster_labels`): that combination (``all faster``); when some proposal tied
with eager (not slower with 90% confidence, :func:`not_slower_labels`), the combination with
the ties added (``all not slower``), so a setting whose gain alone is within noise (a fused
update on a conv net of large tensors) still gets timed beside the others and the ranking
(:mod:`hotloop.tools.ranking`) keeps the wider one unless it measured slower; then each
compiling backend on top of ``all faster`` (``all faster + backend=...``, in the rules' order:
inductor first), then each backend alone. ``all faster`` is timed to the end, in rounds of its
own, before the first compile starts, so a compile that takes longer than its price cannot leave
it unmeasured. ``all not slower`` is timed after the compiles, in what they leave of the budget:
on a slow step both may not fit, and its gain over ``all faster`` is within noise by definition.
A proposal that measured slower alone (with 90% confidence) never enters a combination, so one
slow setting (a thread count, a layout the model does not like) cannot hide the gain of the others.

With one timed proposal there is one stage; with none that compiles nothing, stage one times
the backends alone and stage two has nothing left to time.
"""
from __future__ import annotations

from typing import Sequence

from ..engine.strategy import Strategy
from .proposals import Proposal, combine
from .ranking import against
from .significance import Comparison
from .trials import Budget, Trial, TrialRunner

__all__ = ["ALL_FASTER", "ALL_NOT_SLOWER", "stage_one", "stage_two", "faster_labels", "not_slower_labels",
           "run_in_stages"]

ALL_FASTER = "all faster"
ALL_NOT_SLOWER = "all not slower"


def stage_one(timed: Sequence[Proposal]) -> list[Proposal]:
    """The proposals timed alone first: every one that compiles nothing (all of them if one)."""
    eager = [p for p in timed if p.compile_cost == 0]
    return list(timed) if len(timed) < 2 or not eager else eager


def stage_two(timed: Sequence[Proposal], faster: Sequence[str], not_slower: Sequence[str] = ()) -> list[Proposal]:
    """After stage one: the faster eager proposals combined, then with the ties added (when there are
    any), each backend on top of the faster ones, each backend alone."""
    eager = [p for p in timed if p.compile_cost == 0 and p.label in faster]
    ties = [p for p in timed if p.compile_cost == 0 and p.label in not_slower and p.label not in faster]
    compiling = [p for p in timed if p.compile_cost > 0]      # in the rules' order: inductor first
    out = [c for c in [combine(eager, ALL_FASTER)] if c is not None]
    if ties:
        out += [c for c in [combine(eager + ties, ALL_NOT_SLOWER)] if c is not None]
    for backend in compiling:
        on_top = combine([backend] + eager, f"{ALL_FASTER} + {backend.label}")
        out.append(on_top if on_top is not None else backend)
    out += [b for b in compiling if eager]          # alone (when it was not alone already)
    return out


def _ratios(trials: Sequence[Trial], reference: Trial) -> list[tuple[str, Comparison]]:
    """Each measured trial's label and paired comparison with ``reference``."""
    return [(t.label, against(t, reference)) for t in trials if t.measured and t is not reference]


def faster_labels(trials: Sequence[Trial], reference: Trial) -> list[str]:
    """Labels of the measured trials whose paired ratio to ``reference`` is below 1."""
    return [label for label, c in _ratios(trials, reference) if c.ratio < 1.0]


def not_slower_labels(trials: Sequence[Trial], reference: Trial) -> list[str]:
    """Labels of the measured trials not slower than ``reference`` with 90% confidence (the lower bound
    of the paired ratio at most 1; by medians, the ratio itself): the faster ones and the ties."""
    return [label for label, c in _ratios(trials, reference) if c.lower <= 1.0]


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
    candidates = stage_two(timed, faster_labels(done, reference), not_slower_labels(done, reference))
    second = [t for t in trials_of(candidates) if t.strategy not in seen]
    # the eager combination is timed to the end before any compile starts: a compile that runs
    # past its price would otherwise take the rounds the combination needs; the ties' combination
    # comes last, in what the compiles leave (its gain over the faster ones is within noise alone)
    ties = [t for t in second if t.label == ALL_NOT_SLOWER]
    eager = [t for t in second if t.compile_cost == 0 and t not in ties]
    for part in (eager, [t for t in second if t.compile_cost > 0], ties):
        if part:
            done += runner.run_candidates(part, reference, steps, budget, reserve_steps=reserve_steps)
    return done
