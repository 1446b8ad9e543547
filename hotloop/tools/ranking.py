"""The order in which the tuner judges its faster candidates: fastest first, wider within noise.

Each candidate's time ratio to eager is measured in its own rounds: stage one times each
setting alone, stage two times the faster ones combined (:mod:`hotloop.tools.stages`). Ratios
from different rounds carry the machine's drift between them, so a combination that holds every
setting of a faster single one can measure a higher ratio than that single one by noise alone.
Measured on ``mask_rcnn_shapes`` in bf16 mode (a ``tune()`` trial table, 10,000 planned steps,
4% budget, 2-core AMD EPYC with avx512_bf16): ``bf16`` alone x0.695 of eager,
``all faster`` (bf16 + channels_last + fused update) x0.733, while their median steps were
472 ms and 396 ms; the eager steps paired with stage one took about 680 ms, those paired with
stage two about 540 ms.

So :func:`judging_order` starts from the lowest ratio and moves to a *wider* candidate (one that
sets every field the current one sets, to the same value, and compiles nothing more) whenever
the wider one is not significantly slower (:func:`hotloop.tools.significance.significantly_slower`,
an unpaired 90% test on the two ratios). Every setting in a combination measured faster alone,
so keeping all of them takes no more evidence than the noise allows; dropping one takes a
measurement that says it costs time.

A compiling backend on top of a candidate (``all faster + backend=graph``) is the other way round:
stage two proposes it whether or not the backend alone measured faster, and it brings a compile,
a parity judged against the chaos floor rather than bitwise, and a cache. So the order moves from
it to the candidate without the backend (:func:`adds_backend`) unless the backend's candidate is
significantly faster than that one. Measured on ``yolov3_shapes`` at fp32 (a zoo run, 2-core AMD
EPYC Zen 5 with avx512_bf16, 11.6 s budget): ``all faster + backend=graph`` x0.859 of eager,
``all faster`` x0.901 (90% bound x0.974), their median steps 30.9 ms and 29.0 ms, ``backend=graph``
alone x1.012; the backend's combination, first by ratio, was chosen and ran 0.96x the expert loop.
"""
from __future__ import annotations

from typing import Sequence

from ..engine.strategy import Strategy
from .significance import Comparison, compare_paired, significantly_slower
from .trials import MIN_MEASURED, Trial

__all__ = ["NOT_REACHED", "against", "is_switch", "holds", "adds_backend", "judging_order"]

#: the parity text of a switch that judging did not reach (a candidate before it passed)
NOT_REACHED = "not judged: one judged before it passed"


def against(trial: Trial, reference: Trial) -> Comparison:
    """``trial``'s steps paired round by round with ``reference``'s (eager's)."""
    return compare_paired(trial.step_times, trial.step_rounds, reference.step_times, reference.step_rounds)


def is_switch(trial: Trial, comparison: Comparison, min_gain: float) -> bool:
    """Does judging weigh ``trial``: enough measured steps, and faster than eager by ``min_gain``
    with 90% confidence (``comparison``: :func:`against` eager)?"""
    return len(trial.step_times) >= MIN_MEASURED and comparison.faster(min_gain)


def holds(wider: Trial, narrower: Trial, base: Strategy) -> bool:
    """Does ``wider`` set every field ``narrower`` sets (to the same value), and more, compiling
    nothing that ``narrower`` does not?"""
    return _sets_more(wider, narrower, base) and wider.compile_cost <= narrower.compile_cost


def _sets_more(wider: Trial, narrower: Trial, base: Strategy) -> bool:
    """Does ``wider`` set every field ``narrower`` sets away from ``base``, to the same value, and more?"""
    return narrower.strategy.changes_from(base).items() < wider.strategy.changes_from(base).items()


def adds_backend(wider: Trial, narrower: Trial, base: Strategy) -> bool:
    """Is ``wider`` ``narrower`` (every field it sets, to the same value) on another backend?"""
    return _sets_more(wider, narrower, base) and wider.strategy.backend != narrower.strategy.backend


def judging_order(candidates: Sequence[tuple[Comparison, Trial]], base: Strategy) -> list[Trial]:
    """``candidates`` (their comparison with eager, the trial) in the order parity judges them."""
    remaining = sorted(candidates, key=lambda entry: entry[0].ratio)
    order: list[Trial] = []
    while remaining:
        pick = remaining[0]
        while True:        # a climb adds a setting and no backend; a step down drops a backend: it ends
            wider = [c for c in remaining if c is not pick and holds(c[1], pick[1], base)
                     and not adds_backend(c[1], pick[1], base) and not significantly_slower(c[0], pick[0])]
            without = [c for c in remaining if c is not pick and adds_backend(pick[1], c[1], base)
                       and not significantly_slower(c[0], pick[0])]
            if not (wider or without):
                break
            pick = min(wider or without, key=lambda entry: entry[0].ratio)
        order.append(pick[1])
        remaining.remove(pick)
    return order
