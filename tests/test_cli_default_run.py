"""End to end: `hotloop train` with no arguments solves the default problem (>= 99% seq accuracy)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_default_train_reaches_99_percent_sequence_accuracy(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "hotloop", "train"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = proc.stdout[proc.stdout.rindex("done:"):]
    seq_acc = float(re.search(r"valid: .*seq_accuracy=([0-9.]+)", summary).group(1))
    assert seq_acc >= 0.99, summary
    run_dir = tmp_path / "runs" / "algorithmic_reverse-transformer-transformer_algorithmic"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last_valid = [r for r in rows if r["split"] == "valid"][-1]
    assert last_valid["seq_accuracy"] == pytest.approx(seq_acc, abs=1e-4)
    assert (run_dir / "checkpoints" / "best.json").is_file()
