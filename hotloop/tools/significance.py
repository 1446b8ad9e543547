"""When is a candidate strategy faster than eager? Paired per-round ratios with a confidence bound.

The trials interleave candidates and the eager reference one step per round, so
a round's steps share the machine's load at that moment. For each round where
both stepped, ``r_i = candidate_i / reference_i``. The test is on ``log r_i``:

- the point estimate is the geometric mean ``exp(mean(log r))``;
- the upper bound is the one-sided 90% Student-t bound
  ``exp(mean + t(0.90, n-1) * sd / sqrt(n))``.

A round in which either step took more than :data:`OUTLIER_FACTOR` times the median of its
own contender's steps is left out: such a step measured something else than the candidate
(on a shared machine, another job's burst: with tests running on the same 2 cores, a tuning run
of ``yolov3_shapes`` had eager steps of 3.7-6.9 s among 70 ms ones; alone, its trial steps
stayed within 53-75 ms), and one of them in a pair swings the mean of the logs more than
every other round together.

A candidate is a switch only if the point estimate beats eager by ``min_gain``
**and** the upper bound is below 1: a gain hidden in noise keeps eager, and a
slow round on a loaded machine moves both members of its pair. With fewer than
:data:`MIN_PAIRS` pairs the comparison falls back to the medians of the two
contenders' steps (``paired=False``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

__all__ = ["MIN_PAIRS", "OUTLIER_FACTOR", "Comparison", "compare_paired", "t_quantile_90",
           "significantly_slower"]

MIN_PAIRS = 3
#: a step above this multiple of its contender's median step leaves its round out of the comparison
OUTLIER_FACTOR = 3.0
# one-sided 90% quantiles of Student's t by degrees of freedom (larger df: the nearest smaller key)
_T90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383,
        10: 1.372, 12: 1.356, 15: 1.341, 20: 1.325, 30: 1.310, 60: 1.296, 120: 1.289}


def t_quantile_90(df: int) -> float:
    """The one-sided 90% Student-t quantile for ``df`` >= 1 degrees of freedom (1.282 as df -> inf)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > 120:
        return 1.282
    return _T90[max(k for k in _T90 if k <= df)]


@dataclass(frozen=True)
class Comparison:
    """Candidate time / reference time: point estimate, 90% upper bound, pairs used."""

    ratio: float            # < 1: the candidate is faster
    upper: float            # one-sided 90% upper bound of the ratio (= ratio when compared by medians)
    pairs: int              # rounds where both stepped
    log_se: float = 0.0     # standard error of mean(log r) (0 when compared by medians)

    @property
    def lower(self) -> float:
        """The one-sided 90% lower bound of the ratio, mirroring ``upper`` (= ratio by medians)."""
        return self.ratio * self.ratio / self.upper if 0 < self.upper < math.inf else self.ratio

    @property
    def paired(self) -> bool:
        """Enough pairs for the bound; otherwise the ratio is of the two medians."""
        return self.pairs >= MIN_PAIRS

    def faster(self, min_gain: float) -> bool:
        """A switch: at least ``min_gain`` faster, and (paired) faster with 90% confidence."""
        if self.ratio >= 1.0 - min_gain:
            return False
        return self.upper < 1.0 if self.paired else True

    def describe(self) -> str:
        if self.paired:
            return f"x{self.ratio:.3f} (90% bound x{self.upper:.3f}, {self.pairs} paired rounds)"
        return f"x{self.ratio:.3f} (medians, {self.pairs} paired rounds)"


def compare_paired(candidate: Sequence[float], candidate_rounds: Sequence[int],
                   reference: Sequence[float], reference_rounds: Sequence[int]) -> Comparison:
    """Compare step times (seconds) tagged with their round (-1: outside the interleaved rounds)."""
    by_round = {r: t for r, t in zip(reference_rounds, reference) if r >= 0}
    ref_cut = OUTLIER_FACTOR * statistics.median(reference) if reference else math.inf
    cand_cut = OUTLIER_FACTOR * statistics.median(candidate) if candidate else math.inf
    logs = [math.log(t / by_round[r]) for r, t in zip(candidate_rounds, candidate)
            if r >= 0 and r in by_round and 0 < t <= cand_cut and 0 < by_round[r] <= ref_cut]
    if len(logs) < MIN_PAIRS:
        if not candidate or not reference:
            return Comparison(math.inf, math.inf, len(logs))
        ratio = statistics.median(candidate) / statistics.median(reference)
        return Comparison(ratio, ratio, len(logs))
    mean = statistics.fmean(logs)
    spread = statistics.stdev(logs) / math.sqrt(len(logs))
    return Comparison(math.exp(mean), math.exp(mean + t_quantile_90(len(logs) - 1) * spread), len(logs), spread)


def significantly_slower(a: Comparison, b: Comparison) -> bool:
    """Is the candidate behind ``a`` slower than the one behind ``b``, with 90% confidence?

    Both are ratios to the same reference, possibly from different rounds, so the test is
    unpaired: ``d = log a.ratio - log b.ratio`` with standard error ``sqrt(a.log_se² + b.log_se²)``;
    slower when ``d - t(0.90, df) * se > 0`` (``df``: the fewer pairs less one). Two median-only
    comparisons (no standard error) are slower when ``d > 0``."""
    if not (math.isfinite(a.ratio) and math.isfinite(b.ratio)):
        return a.ratio > b.ratio
    d = math.log(a.ratio) - math.log(b.ratio)
    se = math.hypot(a.log_se, b.log_se)
    df = min(a.pairs, b.pairs) - 1
    return d - (t_quantile_90(df) * se if se > 0 and df >= 1 else 0.0) > 0
