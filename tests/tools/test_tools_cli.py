"""`hotloop tune` and `hotloop profile` through the real CLI entry point."""
from __future__ import annotations

import json

import pytest

from hotloop.cli import main

pytestmark = pytest.mark.timeout(120)

TINY = "hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_length=6,eval_length=6"


def test_tune_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "tune.json"
    assert main(["tune", "--problem", "algorithmic_copy", "--override", TINY, "--max-seconds", "2",
                 "--no-cache", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "candidate" in text and "parity" in text and "<==" in text and "cache: disabled" in text
    data = json.loads(out.read_text())
    assert data["rows"][0]["candidate"] == "eager" and "strategy" in data


def test_profile_prints_every_section_and_writes_html(tmp_path, capsys):
    page = tmp_path / "p.html"
    assert main(["profile", "--problem", "algorithmic_copy", "--override", TINY, "--steps", "2",
                 "--warmup", "1", "--profiled-steps", "1", "--html", str(page)]) == 0
    text = capsys.readouterr().out
    for section in ("time split per step", "input queue", "top ops", "host-device syncs", "memory",
                    "MFU", "recommendations"):
        assert f"== {section} ==" in text
    assert page.read_text().startswith("<!doctype html>")


def test_bad_input_is_one_clear_error(capsys):
    assert main(["tune", "--model", "no_such_model"]) == 2
    assert "unknown model 'no_such_model'" in capsys.readouterr().err
    assert main(["profile", "--override", "hidden_sise=3"]) == 2
    assert "unknown hparam 'hidden_sise'" in capsys.readouterr().err
    assert main(["profile", "--steps", "0"]) == 2
    assert "--steps and --profiled-steps must be >= 1" in capsys.readouterr().err


def test_png_without_matplotlib_is_a_clear_error(capsys, tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # as if it were not installed
    assert main(["profile", "--steps", "1", "--warmup", "0", "--profiled-steps", "1",
                 "--png", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "--png needs matplotlib" in err and "hotloop[plot]" in err and not (tmp_path / "p.png").exists()
