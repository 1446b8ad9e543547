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
A proposal timed with the settings of another (a formulation timed in the layout it is written
for: the 1x1 GEMM in ``channels_last``) is judged against that one as well as eager: it is faster
only if it beats both (:func:`judged_against`), so the layout's gain does not carry a formulation
that is slower than the layout alone into the combination; it joins the ties (``all not slower``)
only with its paired ratio to that one below 1.

Between the stages, a proposal that tied with eager alone (its 80% interval of the paired ratio
holds 1) gets more rounds (:func:`extend_ties`), a chunk at a time, until its interval leaves 1
or it has ``TIE_ROUNDS_FACTOR`` times the trial's steps; only with budget left over once stage
two is priced in full (:func:`stage_two_price`), so the extra rounds never crowd out a compile.
Whether a tie's ratio lands below 1 decides whether it enters ``all faster`` (and the backends
on top of it): on 10 rounds BERT's fused output projection + CE in fp32, a gain within stage
one's noise, entered the choice in one zoo run and not in the next.

With one timed proposal there is one stage; with none that compiles nothing, stage one times
the backends alone and stage two has nothing left to time.

A short budget ends with single settings unjudged and no combination timed. So unless the budget
left holds twice what it takes to bring each proposal of stage one, and then their combination, to
the ``MIN_MEASURED`` steps a comparison needs (warm-up and steps priced at eager's step, with
eager's paired steps: :func:`stage_one_price`), every proposal that compiles nothing is first timed
combined (``all proposed``, :func:`combined_first`), and stage one goes on in what that leaves.
Twice, because the budget shrinks as trials find faster steps (it is a share of the run priced at
the fastest step measured): one epoch of ``lstm_lm_example`` on a 2-core EPYC Zen 5 has 2.7 s left
when stage one starts against a 2.9 s minimum; timing the singles first, its tuner chose the fused
output + CE alone, the budget shrinking with that faster step while four of the five other settings
were still unmeasured (``docs/data/tune_lstm_epoch_zen5_singles_first.json``); timing the
combination first, all six
measured x0.35 of eager's step and were chosen (``docs/data/tune_lstm_epoch_zen5.json``), a step
1.11x faster than the one setting's (``docs/data/lstm_pair_combined_zen5.json``). Thread
counts stay out of ``all proposed``: one answers the machine's load or the model's op sizes, and is
often slower alone (stage one still times it alone). A run whose budget holds stage one twice over
times the singles first (every row of ``docs/data/zoo_bf16_zen5_run2.json``; ``docs/tune.md``, step 5).
A single whose Strategy is the combination's (``fused_optimizer in channels_last`` beside
``channels_last`` and ``fused_optimizer``) is not timed again.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from ..engine.strategy import Strategy
from .proposals import Proposal, combine
from .ranking import against, holds
from .significance import Comparison
from .trials import MIN_MEASURED, Budget, Trial, TrialRunner

__all__ = ["ALL_FASTER", "ALL_NOT_SLOWER", "ALL_PROPOSED", "COMBINED_FIRST_MARGIN", "TIE_ROUNDS_FACTOR",
           "stage_one", "stage_two", "faster_labels", "not_slower_labels", "judged_against", "undecided",
           "stage_one_price", "combined_first", "stage_two_price", "extend_ties", "run_in_stages"]

ALL_FASTER = "all faster"
ALL_NOT_SLOWER = "all not slower"
#: every proposal that compiles nothing, combined: timed first when stage one cannot reach it
ALL_PROPOSED = "all proposed"
#: the singles go first only when the budget left holds this many times the minimum of them and
#: their combination (:func:`combined_first`)
COMBINED_FIRST_MARGIN = 2.0
#: a tie gets extra rounds until it has this many times the trial's measured steps
TIE_ROUNDS_FACTOR = 3


def stage_one(timed: Sequence[Proposal]) -> list[Proposal]:
    """The proposals timed alone first: every one that compiles nothing (all of them if one)."""
    eager = [p for p in timed if p.compile_cost == 0]
    return list(timed) if len(timed) < 2 or not eager else eager


def stage_one_price(proposals: Sequence[Proposal], eager_step: float, warmup: int, steps: int) -> float:
    """Seconds stage one needs for ``proposals`` to take ``steps`` measured steps each: each one's
    warm-up and steps at eager's step (``eager_step``), its compile cost, and eager's paired steps."""
    if not proposals:
        return 0.0
    return sum((warmup + steps) * eager_step + p.compile_cost for p in proposals) + steps * eager_step


def combined_first(first: Sequence[Proposal], eager_step: float, warmup: int,
                   seconds_left: float) -> Proposal | None:
    """``all proposed`` (every proposal of stage one that compiles nothing and sets no thread count,
    combined) when ``seconds_left`` holds less than :data:`COMBINED_FIRST_MARGIN` times what it takes
    to give each proposal and then the combination its warm-up and ``MIN_MEASURED`` paired steps
    (:func:`stage_one_price`); None otherwise, and when fewer than two proposals combine."""
    combined = combine([p for p in first if p.compile_cost == 0 and "intra_op_threads" not in p.changes],
                       ALL_PROPOSED)
    if combined is None or not eager_step > 0.0:
        return None
    reach = stage_one_price(first, eager_step, warmup, MIN_MEASURED)
    reach += stage_one_price([combined], eager_step, warmup, MIN_MEASURED)
    if COMBINED_FIRST_MARGIN * reach <= seconds_left:
        return None
    why = (f"timed first: judging {len(first)} settings alone and then combined needs ~{reach:.1f} s, "
           f"{seconds_left:.1f} s left; ")
    return replace(combined, rule=why + combined.rule)


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


def judged_against(trial: Trial, trials: Sequence[Trial], reference: Trial) -> list[Trial]:
    """What ``trial`` must beat: ``reference``, and the measured trial of the most settings whose
    settings ``trial`` holds, and more (the layout a formulation is timed in), when there is one."""
    inner = [t for t in trials if t.measured and t is not trial and t is not reference
             and holds(trial, t, reference.strategy)]
    if not inner:
        return [reference]
    return [reference, max(inner, key=lambda t: len(t.strategy.changes_from(reference.strategy)))]


def _ratios(trials: Sequence[Trial], reference: Trial) -> list[tuple[str, list[Comparison]]]:
    """Each measured trial's label and paired comparisons with what it is judged against
    (:func:`judged_against`'s order: ``reference`` first)."""
    return [(t.label, [against(t, other) for other in judged_against(t, trials, reference)])
            for t in trials if t.measured and t is not reference]


def faster_labels(trials: Sequence[Trial], reference: Trial) -> list[str]:
    """Labels of the measured trials whose paired ratio to ``reference``, and to the trial whose
    settings they hold (:func:`judged_against`), is below 1."""
    return [label for label, cs in _ratios(trials, reference) if all(c.ratio < 1.0 for c in cs)]


def not_slower_labels(trials: Sequence[Trial], reference: Trial) -> list[str]:
    """Labels of the measured trials not slower than ``reference`` with 90% confidence (the lower bound
    of the paired ratio at most 1; by medians, the ratio itself), and, when one holds another's
    settings (:func:`judged_against`), faster than that one by the paired ratio: the faster ones and
    the ties with eager. A formulation that measured slower than its layout alone is no tie worth
    keeping: in a bf16 zoo run DeepLabV3+'s 1x1 GEMM in channels_last (45.7 ms) tied with
    channels_last alone (44.8 ms) within noise, joined ``all not slower``, and the choice ran 0.95x
    the expert loop."""
    return [label for label, (vs_eager, *vs_layout) in _ratios(trials, reference)
            if vs_eager.lower <= 1.0 and all(c.ratio < 1.0 for c in vs_layout)]


def undecided(trials: Sequence[Trial], reference: Trial, cap: int) -> list[Trial]:
    """The measured trials that compile nothing, tie with ``reference`` (paired, their interval
    holding 1) and have fewer than ``cap`` measured steps."""
    out = []
    for trial in trials:
        if trial.measured and trial.compile_cost == 0 and len(trial.step_times) < cap and trial is not reference:
            comparison = against(trial, reference)
            if comparison.paired and comparison.lower <= 1.0 <= comparison.upper:
                out.append(trial)
    return out


def stage_two_price(candidates: Sequence[Trial], reference: Trial, warmup: int, steps: int) -> float:
    """Seconds stage two needs for ``candidates`` in full: each one's warm-up and steps priced at
    eager's step, its compile cost, and eager's paired steps in each of the (up to three) parts."""
    if not candidates:
        return 0.0
    eager = reference.median
    parts = len({(t.compile_cost > 0, t.label == ALL_NOT_SLOWER) for t in candidates})
    return sum((warmup + steps) * eager + t.compile_cost for t in candidates) + parts * steps * eager


def extend_ties(runner: TrialRunner, done: Sequence[Trial], reference: Trial, steps: int, budget: Budget,
                keep_seconds: Callable[[], float], *, reserve_steps: int = 0) -> int:
    """More interleaved rounds, ``steps // 2`` at a time, for stage one's ties (:func:`undecided`)
    while ``keep_seconds()`` (what stage two and the parity check need) leaves room for the chunk;
    returns the extra rounds run."""
    chunk, extra = max(1, steps // 2), 0
    while True:
        ties = undecided(done, reference, TIE_ROUNDS_FACTOR * steps)
        price = chunk * (sum(t.median for t in ties) + reference.median)
        spare = budget.remaining() - keep_seconds()
        if not ties or price > spare:
            return extra
        more = max(len(t.step_times) for t in ties) + chunk     # measured steps the longest one ends with
        before = runner.rounds_started
        runner.run_candidates(ties, reference, more, Budget(spare, clock=budget.clock), reserve_steps=reserve_steps)
        if runner.rounds_started == before:          # nothing fitted after all
            return extra
        extra += runner.rounds_started - before


def run_in_stages(runner: TrialRunner, timed: Sequence[Proposal], reference: Trial, base: Strategy, steps: int,
                  budget: Budget, *, reserve_steps: int = 0) -> list[Trial]:
    """Both stages through ``runner`` under one ``budget``; every trial, stage one's first.

    ``base``: the reference's Strategy, to which each proposal is applied. A stage-two candidate
    whose Strategy stage one already timed is not timed again."""
    def trials_of(proposals: Sequence[Proposal]) -> list[Trial]:
        return [Trial(p.label, p.apply(base), p.rule, compile_cost=p.compile_cost) for p in proposals]

    first = stage_one(timed)
    eager_step = reference.own_estimate(reference.warmup_times[-1] if reference.warmup_times else 0.0)
    combined = combined_first(first, eager_step, runner.warmup,
                              budget.remaining() - reserve_steps * eager_step)
    done = runner.run_candidates(trials_of([combined]), reference, steps, budget,
                                 reserve_steps=reserve_steps) if combined is not None else []
    singles = [t for t in trials_of(first) if all(t.strategy != c.strategy for c in done)]
    done += runner.run_candidates(singles, reference, steps, budget, reserve_steps=reserve_steps)
    if len(timed) < 2:
        return done
    seen = {t.strategy for t in done} | {reference.strategy}

    def second_stage() -> list[Trial]:
        candidates = stage_two(timed, faster_labels(done, reference), not_slower_labels(done, reference))
        return [t for t in trials_of(candidates) if t.strategy not in seen]

    if reference.measured:
        extend_ties(runner, done, reference, steps, budget, reserve_steps=reserve_steps,
                    keep_seconds=lambda: stage_two_price(second_stage(), reference, runner.warmup, steps))
    second = second_stage()
    # the eager combination is timed to the end before any compile starts: a compile that runs
    # past its price would otherwise take the rounds the combination needs; the ties' combination
    # comes last, in what the compiles leave (its gain over the faster ones is within noise alone)
    ties = [t for t in second if t.label == ALL_NOT_SLOWER]
    eager = [t for t in second if t.compile_cost == 0 and t not in ties]
    for part in (eager, [t for t in second if t.compile_cost > 0], ties):
        if part:
            done += runner.run_candidates(part, reference, steps, budget, reserve_steps=reserve_steps)
    return done
