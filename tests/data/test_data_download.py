"""Verified downloads from a local HTTP server (never the internet) and the default directories."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hotloop.data import ChecksumError, DataError, default_data_dir, default_raw_dir, download
from hotloop.problems.ptb import PTBLanguageModel




@pytest.mark.timeout(20)
def test_download_verifies_and_skips_when_present(http_dir, tmp_path):
    root, url = http_dir
    payload = b"hello data\n" * 1000
    (root / "f.bin").write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    dest = download(url + "f.bin", tmp_path / "out" / "f.bin", expected=sha)
    assert dest.read_bytes() == payload
    (root / "f.bin").unlink()                      # present and matching: no request made
    assert download(url + "f.bin", dest, expected=sha) == dest


@pytest.mark.timeout(20)
def test_download_mismatch_and_missing_are_clear(http_dir, tmp_path):
    root, url = http_dir
    (root / "f.bin").write_bytes(b"tampered")
    with pytest.raises(ChecksumError, match=r"f\.bin.*sha256"):
        download(url + "f.bin", tmp_path / "f.bin", expected="0" * 64)
    assert not list(tmp_path.glob("f.bin*"))       # no partial file left behind
    with pytest.raises(DataError, match=r"download of .*nothing\.bin failed"):
        download(url + "nothing.bin", tmp_path / "n.bin")


def test_default_dirs_honour_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HOTLOOP_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("HOTLOOP_RAW_ROOT", str(tmp_path / "r"))
    assert default_data_dir("ptb_lm") == tmp_path / "d" / "ptb_lm"
    problem = PTBLanguageModel()
    assert problem.data_dir == tmp_path / "d" / "ptb_lm" and problem.raw_dir == tmp_path / "r" / "ptb"
    monkeypatch.delenv("HOTLOOP_DATA_DIR")
    assert default_data_dir("x") == Path.home() / ".cache" / "hotloop" / "data" / "x"
    monkeypatch.delenv("HOTLOOP_RAW_ROOT")
    assert default_raw_dir("ptb") == Path.home() / ".cache" / "hotloop" / "raw" / "ptb"
