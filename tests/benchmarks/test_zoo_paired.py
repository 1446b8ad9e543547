"""``benchmarks/zoo.py``'s per-row verdict: blocks paired by round, an 80% interval, faster / slower / tie."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from zoo import paired_speedup, round_order, verdicts  # noqa: E402


def test_drift_shared_by_a_round_cancels() -> None:
    # the machine slows down round after round; hotloop's block is 10% shorter in every round
    reference = [0.10, 0.13, 0.16, 0.19, 0.22]
    contender = [t / 1.1 for t in reference]
    out = paired_speedup(reference, contender)
    assert out["verdict"] == "faster" and out["pairs"] == 5
    assert out["paired"] == pytest.approx(1.1)
    low, high = out["interval90"]
    assert low == pytest.approx(1.1) and high == pytest.approx(1.1)


def test_noise_around_equal_speed_is_a_tie() -> None:
    reference = [0.100, 0.100, 0.100, 0.100, 0.100, 0.100]
    contender = [0.095, 0.106, 0.098, 0.103, 0.094, 0.104]
    out = paired_speedup(reference, contender)
    low, high = out["interval90"]
    assert out["verdict"] == "tie" and low < 1.0 < high


def test_clearly_slower_and_clearly_faster() -> None:
    reference = [0.100, 0.102, 0.098, 0.101, 0.099]
    slower = paired_speedup(reference, [t * 1.15 for t in [0.101, 0.100, 0.099, 0.102, 0.098]])
    faster = paired_speedup(reference, [t / 1.15 for t in [0.101, 0.100, 0.099, 0.102, 0.098]])
    assert slower["verdict"] == "slower" and slower["interval90"][1] < 1.0
    assert faster["verdict"] == "faster" and faster["interval90"][0] > 1.0
    assert faster["interval90"][0] < faster["paired"] < faster["interval90"][1]


def test_too_few_rounds_have_no_verdict() -> None:
    out = paired_speedup([0.1, 0.1], [0.05, 0.05])
    assert out == {"paired": None, "interval90": None, "verdict": "unpaired", "pairs": 2}


def test_verdicts_group_models() -> None:
    rows = [{"model": "a", "v": {"verdict": "tie"}}, {"model": "b", "v": {"verdict": "faster"}},
            {"model": "c", "v": {"verdict": "tie"}}]
    assert verdicts(rows, "v") == {"tie": ["a", "c"], "faster": ["b"]}


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_round_orders_balance_positions_and_neighbours(n: int) -> None:
    from collections import Counter
    period = n if n % 2 == 0 else 2 * n
    rows = [round_order(n, r) for r in range(period)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    positions = Counter((c, i) for row in rows for i, c in enumerate(row))
    assert set(positions.values()) == {period // n}                  # every contender in every place alike
    follows = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1   # after every other alike
    assert rows[0] != rows[1]


def test_a_fixed_strategy_is_timed_untuned(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import zoo
    from hotloop.engine import Strategy

    def no_tuning(*args, **kwargs):
        raise AssertionError("--strategy must not tune")
    monkeypatch.setattr(zoo, "auto_strategy", no_tuning)
    fixed = Strategy.parse("fused_kernel=True,pointwise_conv=gemm,prefetch=0")
    row = zoo.bench_model("yolov3", 1, 1, torch.device("cpu"), 0.0, lambda line: None, precision="fp32",
                          overrides=zoo.SMOKE_DEFAULT, fixed=fixed)
    assert row["strategy"] == {"fused_kernel": True, "pointwise_conv": "gemm", "prefetch": 0}
    assert row["settings"]["hotloop"]["prefetch"] == 0 and row["steps_each"] == 2
