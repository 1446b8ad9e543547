"""``benchmarks/gpu_check.sh --device cpu --dry-run``: every part runs (tiny) and writes its JSON; the report renders."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_report import junit_summary, render  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def test_gpu_check_dry_run_on_cpu_writes_every_part(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check"
    env = {**os.environ, "PYTHON": sys.executable, "HOTLOOP_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--dry-run", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parts = {p["part"]: p for p in json.loads((out / "parts.json").read_text())}
    assert {"machine", "cuda_tests", "step_gap", "zoo", "default_train", "fsdp"} <= set(parts)
    assert all(p["rc"] == 0 for p in parts.values()), parts
    zoo = json.loads((out / "zoo_full.json").read_text())
    assert zoo["smoke"] and [r["model"] for r in zoo["rows"]] == ["se_resnext50"]
    assert {"speedup_vs_naive", "speedup_vs_expert", "plain_loss", "expert_loss", "hotloop_loss"} <= set(zoo["rows"][0])
    tests = json.loads((out / "tests.json").read_text())
    assert tests["tests"] > 0 and not tests["failed"]
    assert all("CUDA" in s["message"] for s in tests["skipped"])          # on a CPU every case is CUDA-only
    default = json.loads((out / "default.json").read_text())
    assert default["steps"] == 10 and default["last_valid"]["loss"] > 0
    fsdp = json.loads((out / "fsdp.json").read_text())
    assert fsdp["steps"] == 5 and fsdp["strategy"]["data_parallel"] == "fsdp", fsdp
    gap = json.loads((out / "step_gap.json").read_text())
    assert [r["model"] for r in gap["rows"]] == ["bert"] and {"expert", "hotloop"} <= set(gap["rows"][0]["step_ms"])
    report = render(out)
    assert "| bert | hotloop |" in report
    assert "| se_resnext50 | small |" in report and "SMOKE: not a measurement" in report
    assert "The default run" in report and "10 steps" in report


def test_junit_summary_names_failures_and_skips(tmp_path: Path) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="a" name="ok"/>'
                   '<testcase classname="a" name="bad"><failure message="boom"/></testcase>'
                   '<testcase classname="a" name="gpu"><skipped message="needs CUDA"/></testcase>'
                   '</testsuite></testsuites>')
    summary = junit_summary(xml)
    assert summary["tests"] == 3 and summary["passed"] == 1
    assert summary["failed"] == [{"test": "a::bad", "message": "boom"}]
    assert summary["skipped"] == [{"test": "a::gpu", "message": "needs CUDA"}]


def test_docs_gpu_md_is_the_report_of_the_kept_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/gpu.md holds no number that docs/data/gpu_check/ does not: it is that folder's report
    (the parts of several device calls, with the notes kept beside the JSON)."""
    monkeypatch.chdir(REPO)
    report = render(Path("docs/data/gpu_check"))
    assert (REPO / "docs" / "gpu.md").read_text() == report
    assert "| call |" in report and "## Reading the zoo rows" in report
