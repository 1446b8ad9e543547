"""``benchmarks/strategy_pair.py`` and ``benchmarks/update_layout.py``: the pairs they time compute the
same numbers (equal warm-up losses for a setting that leaves the math alone, bitwise equal parameters
for the update in storage order) and their JSON names both sides."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from strategy_pair import main as pair_main, pair_row  # noqa: E402
from update_layout import layout_row  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_se_backward_pair_gives_equal_warm_up_losses() -> None:
    row = pair_row("se_resnext50", "fused_optimizer=True,channels_last=True",
                   "fused_optimizer=True,channels_last=True,se_backward=fused", rounds=1, block=2, batches=2)
    assert row["b"] == {"channels_last": True, "se_backward": "fused"}
    assert len(row["first_losses"]["a"]) == 2 and row["first_losses_equal"]
    assert set(row["step_ms"]) == {"a", "b"} and all(ms > 0 for ms in row["step_ms"].values())


def test_pair_json_keeps_the_row(tmp_path: Path) -> None:
    out = tmp_path / "pair.json"
    assert pair_main(["--model", "se_resnext50", "--a", "channels_last=True", "--b", "channels_last=False",
                      "--rounds", "1", "--block", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["model"] == "se_resnext50" and "b_vs_a" in rows[0]


def test_update_in_storage_order_matches_torchs_bitwise() -> None:
    row = layout_row("yolov3", rounds=1, block=2)
    assert row["equal"] and row["non_contiguous"] > 0
    assert set(row["update_ms"]) == {"torch", "ordered"}


def test_linear_gemm_rows_time_the_same_layer_both_ways() -> None:
    from linear_gemm import case_row
    row = case_row("tiny", 64, 32, 48, repeats=1)
    assert row["blas_ms"] > 0 and row["onednn_ms"] > 0 and row["speedup"] == row["blas_ms"] / row["onednn_ms"]
    assert row["max_out_rel_diff"] < 1e-5 and row["max_wgrad_rel_diff"] < 1e-5   # the same layer, reordered sums
