"""A run remembers its data: eval, decode, export and --resume reuse the recorded data directory and
raw root, and prepared data that matches its manifest is used with the raw files gone."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import raw_data_dir, require_raw_data

from hotloop import cli
from hotloop.compose.run_data import RunData, record_data_paths, recorded_data, using_roots

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(240)]

LM = ["--problem", "ptb_lm", "--model", "lstm_lm", "--hparams", "lstm_lm_small",
      "--override", "hidden_size=8,num_layers=1,batch_size=128,max_length=35"]     # 17 valid batches



def test_explicit_paths_win_and_recorded_roots_count_only_while_they_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_RAW_ROOT", str(tmp_path))
    monkeypatch.delenv("HOTLOOP_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    run = record_data_paths("d", None)
    assert run == {"data_dir": str(tmp_path / "d"), "raw_dir": None, "raw_root": str(tmp_path), "data_root": None}
    run["raw_dir"] = str(tmp_path / "r")
    assert recorded_data(run) == RunData(str(tmp_path / "d"), str(tmp_path / "r"), str(tmp_path), None)
    given = recorded_data(run, data_dir="other", raw_root="root")
    assert given == RunData(str(tmp_path / "other"), None, str(tmp_path / "root"), None)
    assert recorded_data({**run, "raw_root": str(tmp_path / "gone")}).raw_root is None
    monkeypatch.setenv("HOTLOOP_RAW_ROOT", "/elsewhere")
    with using_roots(recorded_data(run)):
        assert os.environ["HOTLOOP_RAW_ROOT"] == str(tmp_path)
    assert os.environ["HOTLOOP_RAW_ROOT"] == "/elsewhere"


def _hotloop(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eval_decode_export_and_resume_work_after_the_raw_files_are_gone(tmp_path, monkeypatch, capsys):
    ptb = require_raw_data(raw_data_dir("ptb") / "ptb.train.txt", "PTB")
    work = tmp_path / "work"
    (work / "raw").mkdir(parents=True)
    shutil.copytree(ptb, work / "raw" / "ptb")
    monkeypatch.delenv("HOTLOOP_RAW_ROOT", raising=False)   # restored after the test (--raw-root sets it)
    monkeypatch.delenv("HOTLOOP_DATA_DIR", raising=False)
    monkeypatch.chdir(work)                                  # relative paths at training time
    code, out, err = _hotloop(capsys, "train", *LM, "--raw-root", "raw", "--data-dir", "data",
                              "--output-dir", "run", "--max-steps", "2", "--eval-every", "0",
                              "--strategy", "default", "--loggers", "jsonl")
    assert code == 0, err
    recorded = json.loads((work / "run" / "run.json").read_text())
    assert recorded["data_dir"] == str(work / "data") and recorded["raw_root"] == str(work / "raw")
    shutil.rmtree(work / "raw")                              # only the prepared data is left
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("HOTLOOP_RAW_ROOT", str(empty))       # this shell's roots hold nothing
    monkeypatch.setenv("HOTLOOP_DATA_DIR", str(empty))
    monkeypatch.chdir(tmp_path)
    run = str(work / "run")
    code, out, err = _hotloop(capsys, "eval", "--output-dir", run, "--splits", "test")
    assert code == 0 and "test: loss=" in out, err
    (tmp_path / "prompts.txt").write_text("the company\n")
    code, out, err = _hotloop(capsys, "decode", "--output-dir", run, "--decode-from-file", "prompts.txt",
                              "--decode-to-file", "out.txt", "--max-length", "3", "--no-progress")
    assert code == 0, err
    assert (tmp_path / "out.txt").read_text().strip()
    code, out, err = _hotloop(capsys, "export", "--output-dir", run, "--format", "safetensors")
    assert code == 0, err
    code, out, err = _hotloop(capsys, "train", *LM, "--output-dir", run, "--resume", "--max-steps", "3",
                              "--eval-every", "0", "--strategy", "default", "--loggers", "jsonl")
    assert code == 0 and "done: 3 steps" in out, err
    # an explicit --data-dir still wins: an empty one needs the raw files, which are gone
    code, out, err = _hotloop(capsys, "eval", "--output-dir", run, "--splits", "test", "--data-dir", str(empty))
    assert code == 2 and "PTB files" in err, (code, err)
