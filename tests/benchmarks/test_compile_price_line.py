"""``benchmarks/compile_price.py``'s price line: a fixed start-up plus seconds per op, above every row."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from compile_price import MARGIN, price_line  # noqa: E402


def _rows(points):
    return [{"ops_per_step": ops, "cold_s": seconds} for ops, seconds in points]


def test_the_line_covers_every_row_with_the_margin() -> None:
    rows = _rows([(1000, 45.0), (1100, 40.0), (2500, 72.0), (2600, 60.0)])
    fixed, per_op = price_line(rows)
    assert fixed > 0 and per_op > 0
    covered = [(fixed + per_op * r["ops_per_step"]) / r["cold_s"] for r in rows]
    assert min(covered) >= MARGIN - 1e-9
    assert min(covered) == pytest.approx(MARGIN)          # no higher than it needs to be


def test_an_exact_line_is_kept_and_raised_by_the_margin() -> None:
    fixed, per_op = price_line(_rows([(1000, 30.0), (2000, 50.0), (3000, 70.0)]))
    assert fixed == pytest.approx(10.0 * MARGIN) and per_op == pytest.approx(0.02 * MARGIN)


def test_one_row_is_priced_per_op() -> None:
    assert price_line(_rows([(1000, 40.0)])) == pytest.approx((0.0, 0.04 * MARGIN))
