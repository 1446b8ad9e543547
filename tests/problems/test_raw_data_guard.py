"""The real-data guard: missing raw data skips locally but fails a CI run."""
from __future__ import annotations

import pytest
from helpers import raw_data_dir, require_raw_data


def test_missing_raw_data_skips_locally_and_fails_under_ci(tmp_path, monkeypatch):
    missing = tmp_path / "ptb" / "ptb.train.txt"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="HOTLOOP_RAW_ROOT"):
        require_raw_data(missing, "PTB")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true needs it"):
        require_raw_data(missing, "PTB")
    missing.parent.mkdir()
    missing.write_text("present\n")
    assert require_raw_data(missing, "PTB") == missing.parent      # present: no skip, no failure


def test_raw_data_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_RAW_ROOT", str(tmp_path))
    assert raw_data_dir("multi30k") == tmp_path / "multi30k"
    monkeypatch.delenv("HOTLOOP_RAW_ROOT")
    assert raw_data_dir("ptb").parts[-3:] == ("shared", "data", "ptb")
