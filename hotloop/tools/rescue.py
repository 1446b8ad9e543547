"""A combination that failed parity, timed again without the parts that failed parity alone.

Stage two (:mod:`hotloop.tools.stages`) combines every setting that measured faster alone. When
one of them changes the rounding more than the model tolerates (a formulation whose fp32
reordering a chaotic loss amplifies past ``check_parity``), the combination fails with it, and
judging (:func:`hotloop.tools.autotune._choose`) moves on to a narrower candidate, often one
setting alone: the gains of the other settings in the combination are lost. When judging has
rejected some of the combination's parts on their own (parts that measured faster alone, so judging
weighed them; a part that did not is kept), :func:`without_failed_parts` builds the combination
less those parts, a candidate the tuner then times and judges like any other;
it replaces the winner when it holds every setting of the winner and is not slower than it with
90% confidence (the rule :func:`hotloop.tools.ranking.judging_order` applies to wider candidates).
"""
from __future__ import annotations

from typing import Sequence

from .ranking import against, holds, is_switch
from .significance import significantly_slower
from .stages import ALL_FASTER, ALL_NOT_SLOWER
from .trials import Trial

__all__ = ["without_failed_parts", "keeps_rescue"]

_COMBINED = (ALL_NOT_SLOWER, ALL_FASTER)


def _rejected(trial: Trial) -> bool:
    return "REJECTED" in trial.parity


def without_failed_parts(trials: Sequence[Trial], winner: Trial, baseline: Trial,
                         min_gain: float) -> Trial | None:
    """The first failed eager combination, less its parts judged and rejected alone, when that sets
    every field the winner sets and more, and no trial had its Strategy; else None."""
    base = baseline.strategy
    singles = [t for t in trials if t.label not in _COMBINED and t.compile_cost == 0 and t is not baseline
               and t.strategy.changes_from(base)]
    seen = {t.strategy for t in trials} | {base}
    for combined in (t for label in _COMBINED for t in trials if t.label == label and _rejected(t)):
        changes = combined.strategy.changes_from(base).items()
        parts = [t for t in singles if t.strategy.changes_from(base).items() <= changes]
        failed = [t for t in parts if _rejected(t) and is_switch(t, against(t, baseline), min_gain)]
        kept = {k: v for t in parts if t not in failed for k, v in t.strategy.changes_from(base).items()}
        if not failed or not kept:
            continue
        rescue = Trial(f"{combined.label} - {' - '.join(t.label for t in failed)}", base.replace(**kept),
                       f"{combined.label} without the parts rejected alone ({', '.join(t.label for t in failed)})")
        if rescue.strategy not in seen and (winner is baseline or holds(rescue, winner, base)):
            return rescue
    return None


def keeps_rescue(rescue: Trial, winner: Trial, baseline: Trial) -> bool:
    """Does the judged ``rescue`` replace ``winner``? (It passed judging; module doc for the rule.)"""
    if winner is baseline:
        return True
    return not significantly_slower(against(rescue, baseline), against(winner, baseline))
