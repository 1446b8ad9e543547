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


def _row(model: str, ratios: list[float]) -> dict:
    reference = [0.1] * len(ratios)
    return {"model": model, "v": paired_speedup(reference, [0.1 / r for r in ratios])}


def test_familywise_widens_a_per_row_slower_to_a_tie() -> None:
    from zoo import familywise
    noisy = [0.95, 1.01, 0.96, 1.0, 0.94, 1.02, 0.97, 0.98]          # slower at 90%, not beyond doubt
    rows = [_row("noisy", noisy)] + [_row(f"tie{i}", [1.0 + 0.01 * ((j + i) % 3 - 1) for j in range(8)])
                                     for i in range(6)]
    assert rows[0]["v"]["verdict"] == "slower"
    family = familywise(rows, "v")
    assert family["rows"] == 7 and family["one_sided_level"] == pytest.approx(0.9 ** (1 / 7))
    assert "noisy" in family["verdicts"]["tie"] and "slower" not in family["verdicts"]
    low, high = family["bounds"]["noisy"]
    per_row_low, per_row_high = rows[0]["v"]["interval90"]
    assert low < per_row_low and high > per_row_high > 0.99                # wider on both sides
    assert family["lowest"][0] == "noisy"


def test_familywise_keeps_a_clear_slower_and_matches_one_row() -> None:
    from zoo import familywise
    slow = _row("slow", [0.80, 0.81, 0.79, 0.80, 0.82, 0.80, 0.79, 0.81])
    assert familywise([slow] * 7, "v")["verdicts"] == {"slower": ["slow"] * 7}
    one = familywise([slow], "v")                                         # one row: the level is 90% itself
    assert one["bounds"]["slow"] == pytest.approx(slow["v"]["interval90"])
    unpaired = {"model": "u", "v": paired_speedup([0.1, 0.1], [0.1, 0.1])}
    assert familywise([unpaired], "v")["rows"] == 0
