"""A combination that failed parity, timed again without the parts that fail parity alone, or with
the winner's settings on top.

Stage two (:mod:`hotloop.tools.stages`) combines every setting that measured faster alone. When
one of them changes the rounding more than the model tolerates (a formulation whose fp32
reordering a chaotic loss amplifies past ``check_parity``), the combination fails with it, and
judging (:func:`hotloop.tools.autotune._choose`) moves on to a narrower candidate, often one
setting alone: the gains of the other settings in the combination are lost. A part fails alone
when judging rejected it (a part that measured faster alone, judged in full), or when judging it in
full now rejects it (:class:`PartJudge`: the trajectory within the chaos floor, then
``check_parity``), for a part that judging left open: one that did not measure faster (judged by the
plain tolerance only) or a faster one that judging did not reach because a candidate before it
passed. :func:`without_failed_parts` builds the combination less the failed parts, a candidate the
tuner then times and judges like any other; it replaces the winner when it holds every setting of
the winner and is not slower than it with 90% confidence (the rule
:func:`hotloop.tools.ranking.judging_order` applies to wider candidates).

A part may fail alone for want of another. On a 2-core AMD EPYC Zen 3 aten's channels-last batch
norm sums its statistics in fp32 row after row, so ``channels_last`` and every formulation timed in
it fail SE-ResNeXt's trajectory (2.0e-4 against 4 x a chaos floor of 2.9e-5), while
``batch_norm=two_pass`` in channels-last passes (5.3e-5) and wins judging alone, slower than the
failed combination it would make pass (``docs/data/zoo_zen3_tune_tables.json``). :func:`with_winner`
builds that candidate: the first failed eager combination with the winner's settings on top, where
no field conflicts; it replaces the winner by the same rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .ranking import NOT_REACHED, against, holds, is_switch
from .significance import significantly_slower
from .stages import ALL_FASTER, ALL_NOT_SLOWER, ALL_PROPOSED
from .trials import Trial

__all__ = ["PartJudge", "without_failed_parts", "with_winner", "keeps_rescue"]

_COMBINED = (ALL_NOT_SLOWER, ALL_FASTER, ALL_PROPOSED)


@dataclass(frozen=True)
class PartJudge:
    """How the tuner judges a part of a failed combination that judging left open: ``passes(trial)``
    judges it in full (trajectory and ``check_parity``), asked only when ``affordable(trial)`` (else
    the part stays in)."""

    passes: Callable[[Trial], bool] = lambda trial: True
    affordable: Callable[[Trial], bool] = lambda trial: False


def _rejected(trial: Trial) -> bool:
    return "REJECTED" in trial.parity


def _fails(trial: Trial, baseline: Trial, min_gain: float, judge: PartJudge) -> bool:
    if is_switch(trial, against(trial, baseline), min_gain):
        if _rejected(trial):
            return True           # judged in full
        left_open = trial.parity == NOT_REACHED
    else:
        left_open = _rejected(trial)    # judged by the plain tolerance only
    return left_open and judge.affordable(trial) and not judge.passes(trial)


def without_failed_parts(trials: Sequence[Trial], winner: Trial, baseline: Trial, min_gain: float,
                         judge: PartJudge = PartJudge()) -> Trial | None:
    """The first failed eager combination, less its parts that fail alone (module doc), when that sets
    every field the winner sets and more, and no trial had its Strategy; else None."""
    base = baseline.strategy
    singles = [t for t in trials if t.label not in _COMBINED and t.compile_cost == 0 and t is not baseline
               and t.strategy.changes_from(base)]
    seen = {t.strategy for t in trials} | {base}
    verdicts: dict[int, bool] = {}      # each part judged once, whatever the combinations it is in
    for combined in (t for label in _COMBINED for t in trials if t.label == label and _rejected(t)):
        changes = combined.strategy.changes_from(base).items()
        parts = [t for t in singles if t.strategy.changes_from(base).items() <= changes]
        for t in parts:
            if id(t) not in verdicts:
                verdicts[id(t)] = _fails(t, baseline, min_gain, judge)
        failed = [t for t in parts if verdicts[id(t)]]
        kept = {k: v for t in parts if t not in failed for k, v in t.strategy.changes_from(base).items()}
        if not failed or not kept:
            continue
        rescue = Trial(f"{combined.label} - {' - '.join(t.label for t in failed)}", base.replace(**kept),
                       f"{combined.label} without the parts that fail alone ({', '.join(t.label for t in failed)})")
        if rescue.strategy not in seen and (winner is baseline or holds(rescue, winner, base)):
            return rescue
    return None


def with_winner(trials: Sequence[Trial], winner: Trial, baseline: Trial) -> Trial | None:
    """The first failed eager combination with ``winner``'s settings on top (module doc), when none
    conflicts with the combination's and no trial had the result's Strategy; else None."""
    base = baseline.strategy
    adds = winner.strategy.changes_from(base)
    if winner is baseline or not adds:
        return None
    seen = {t.strategy for t in trials} | {base}
    for combined in (t for label in _COMBINED for t in trials if t.label == label and _rejected(t)
                     and t.compile_cost == 0):
        changes = combined.strategy.changes_from(base)
        if any(k in changes and changes[k] != v for k, v in adds.items()):
            continue
        repaired = Trial(f"{combined.label} + {winner.label}", combined.strategy.replace(**adds),
                         f"{combined.label} with the winner's settings on top ({winner.label})")
        if repaired.strategy not in seen:
            return repaired
    return None


def keeps_rescue(rescue: Trial, winner: Trial, baseline: Trial) -> bool:
    """Does the judged ``rescue`` replace ``winner``? (It passed judging; module doc for the rule.)"""
    if winner is baseline:
        return True
    return not significantly_slower(against(rescue, baseline), against(winner, baseline))
