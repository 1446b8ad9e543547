"""benchmarks/byo_data.py runs (--smoke: tiny sizes; its numbers mean nothing and are not checked)."""
from __future__ import annotations

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "byo_data.py"


def test_byo_data_benchmark_smoke(tmp_path):
    out = tmp_path / "byo.json"
    runpy.run_path(str(SCRIPT), run_name="byo_data")["main"](["--smoke", "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["median_steps_per_s"]) == {"plain", "hotloop"} and result["smoke"] is True
    assert all(rate > 0 for rates in result["steps_per_s"].values() for rate in rates)
