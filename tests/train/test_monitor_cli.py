"""``hotloop train --monitor NAME --mode min|max --early-stop PATIENCE``: flags, config keys, run.json."""
from __future__ import annotations

import json

import pytest

from hotloop import cli

pytestmark = pytest.mark.timeout(180)
TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2")
BASE = ("train", "--override", TINY, "--eval-every", "2", "--strategy", "default", "--loggers", "jsonl")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hotloop: error: "), err
    return lines[0]


def test_an_unknown_monitor_is_one_line_listing_the_metrics_before_training(capsys, tmp_path):
    code, out, err = run(capsys, *BASE, "--output-dir", str(tmp_path / "r"), "--max-steps", "4",
                         "--monitor", "acuracy")
    line = one_line_error(code, err)
    assert "'acuracy'" in line and "has: accuracy, examples, loss, ppl, seq_accuracy, tokens" in line
    assert not (tmp_path / "r" / "run.json").exists() and not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize("flags,words", [(("--early-stop", "-1"), "--early-stop must be >= 0"),
                                         (("--early-stop-min-delta", "-0.5"), "--early-stop-min-delta must be")])
def test_bad_patience_or_delta_is_one_line(capsys, tmp_path, flags, words):
    code, _, err = run(capsys, *BASE, "--output-dir", str(tmp_path / "r"), "--max-steps", "4", *flags)
    assert words in one_line_error(code, err)


def test_monitor_and_early_stop_from_flags_then_from_run_json(capsys, tmp_path):
    first = tmp_path / "first"
    code, out, err = run(capsys, *BASE, "--output-dir", str(first), "--max-steps", "100", "--monitor", "accuracy",
                         "--mode", "max", "--early-stop", "2", "--early-stop-min-delta", "5")
    assert code == 0, err
    assert "done: 6 steps" in out and "early stopping: valid accuracy did not improve for 2" in out
    info = json.loads((first / "run.json").read_text())
    assert {k: info[k] for k in ("monitor", "mode", "early_stop", "early_stop_min_delta")} == \
        {"monitor": "accuracy", "mode": "max", "early_stop": 2, "early_stop_min_delta": 5.0}
    best = json.loads((first / "checkpoints" / "best.json").read_text())
    assert (best["monitor"], best["mode"]) == ("accuracy", "max")
    rows = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    accuracy = {r["step"]: r["accuracy"] for r in rows if r["split"] == "valid"}
    assert best["value"] == max(accuracy.values())
    again = tmp_path / "again"
    code, out, err = run(capsys, "train", "--config", str(first / "run.json"), "--output-dir", str(again))
    assert code == 0, err
    assert "done: 6 steps" in out
    assert json.loads((again / "checkpoints" / "best.json").read_text())["step"] == best["step"]


def test_a_config_file_with_a_bad_mode_is_one_line(capsys, tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"override": TINY, "max_steps": 2, "mode": "maximum", "strategy": "default"}))
    code, _, err = run(capsys, "train", "--config", str(config), "--output-dir", str(tmp_path / "r"))
    assert "--mode must be min or max, got 'maximum'" in one_line_error(code, err)
    config.write_text(json.dumps({"early_stop": "3"}))
    code, _, err = run(capsys, "train", "--config", str(config), "--output-dir", str(tmp_path / "r"))
    assert "'early_stop' must be integer" in one_line_error(code, err)
