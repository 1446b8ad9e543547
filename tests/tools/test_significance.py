"""The switch rule: paired per-round time ratios against eager, with a 90% confidence bound."""
from __future__ import annotations

import math
import random

import pytest

from hotloop.tools.significance import MIN_PAIRS, compare_paired, t_quantile_90


def _noisy(base: float, n: int, noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [base * (1 + rng.uniform(-noise, noise)) for _ in range(n)]


def test_t_quantiles_match_the_table_and_the_limit():
    assert t_quantile_90(1) == pytest.approx(3.078)
    assert t_quantile_90(11) == pytest.approx(1.372)       # nearest smaller tabulated df (10)
    assert t_quantile_90(10_000) == pytest.approx(1.282)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_90(0)


def test_a_steady_ten_percent_gain_is_a_switch():
    rounds = list(range(8))
    ref = _noisy(10e-3, 8, 0.02, seed=1)
    cand = [t * 0.9 for t in _noisy(10e-3, 8, 0.0, seed=2)]
    cand = [c * (r / 10e-3) for c, r in zip(cand, ref)]             # same load per round
    result = compare_paired(cand, rounds, ref, rounds)
    assert result.paired and result.pairs == 8
    assert result.ratio == pytest.approx(0.9, rel=1e-9)
    assert result.upper < 1.0 and result.faster(min_gain=0.02)


def test_no_gain_in_noise_keeps_eager():
    rounds = list(range(6))
    ref, cand = _noisy(10e-3, 6, 0.10, seed=3), _noisy(10e-3, 6, 0.10, seed=4)
    result = compare_paired(cand, rounds, ref, rounds)
    assert result.paired
    assert not result.faster(min_gain=0.02), result.describe()


def test_a_point_gain_with_a_wide_bound_is_not_a_switch():
    # ratios 0.80, 1.10, 0.85, 1.05: geometric mean ~0.94 but the 90% bound is above 1
    ref = [1.0, 1.0, 1.0, 1.0]
    cand = [0.80, 1.10, 0.85, 1.05]
    result = compare_paired(cand, [0, 1, 2, 3], ref, [0, 1, 2, 3])
    assert result.ratio < 0.98 and result.upper > 1.0
    assert not result.faster(min_gain=0.02)


def test_pairing_sees_through_load_that_misleads_the_medians():
    # the reference ran its steps in quiet rounds 0-3, the candidate ran more in loaded rounds 4-7:
    # medians say the candidate is slower; round by round it is 10% faster
    load = [1, 1, 1, 1, 3, 3, 3, 3]
    ref = [10e-3 * k for k in load]
    cand = [9e-3 * k for k in load]
    rounds = list(range(8))
    paired = compare_paired(cand[2:], rounds[2:], ref[:6], rounds[:6])          # pairs: rounds 2-5
    assert paired.paired and paired.pairs == 4 and paired.faster(0.02)
    unpaired = compare_paired(cand[2:], [-1] * 6, ref[:6], [-1] * 6)
    assert not unpaired.paired and unpaired.ratio > 1.0 and not unpaired.faster(0.02)


def test_too_few_pairs_fall_back_to_medians():
    result = compare_paired([8e-3] * 5, [-1, -1, -1, 7, 8], [10e-3] * 3, [-1, 7, 8])
    assert result.pairs == 2 < MIN_PAIRS and not result.paired
    assert result.ratio == pytest.approx(0.8) and result.faster(0.02)
    assert math.isinf(compare_paired([], [], [1.0], [0]).ratio)


def test_rounds_with_a_step_far_above_its_median_are_left_out():
    """yolov3_shapes' trials on a 2-core EPYC shared with a test run: a candidate 20% faster in
    every ordinary round, with multi-second steps (the other job's bursts) on either side in three rounds. Those rounds
    swing the mean of the logs either way; left out, the gain is a switch."""
    ref = [70.9, 71.5, 215.9, 70.3, 93.7, 71.6, 3876.0, 3658.7]
    cand = [55.4, 52.8, 55.1, 760.6, 71.3, 55.3, 3228.9, 68.0]
    rounds = list(range(8))
    result = compare_paired(cand, rounds, ref, rounds)
    assert result.pairs == 5          # rounds 3 (candidate 760.6), 6 and 7 (reference) are out
    assert result.ratio < 0.85 and result.faster(0.02), result.describe()
    slower = compare_paired(ref, rounds, cand, rounds)     # the same data the other way round
    assert slower.ratio > 1.15 and not slower.faster(0.02)


def test_the_lower_bound_mirrors_the_upper_one_on_the_logs():
    rounds = list(range(6))
    result = compare_paired(_noisy(9e-3, 6, 0.05, seed=5), rounds, _noisy(10e-3, 6, 0.05, seed=6), rounds)
    assert result.lower < result.ratio < result.upper
    assert math.log(result.ratio) - math.log(result.lower) == pytest.approx(
        t_quantile_90(result.pairs - 1) * result.log_se)
    by_medians = compare_paired([1.0], [0], [2.0], [0])           # one pair: no bound either way
    assert by_medians.lower == by_medians.ratio == by_medians.upper == 0.5

