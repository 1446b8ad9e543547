"""PTB word-level LM problem: datagen, vocabulary, counts, windows, resume, checksums, download."""
from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import raw_data_dir, require_raw_data
from hotloop.data import ChecksumError, DataError
from hotloop.hparams import HParams
from hotloop.problems.ptb import PTB_TOKENS, PTBLanguageModel, fetch_ptb, read_words
from hotloop.registry import problems

RAW = raw_data_dir("ptb")


@pytest.fixture(scope="session", autouse=True)
def ptb_raw_data() -> Path:
    """Every test here needs the raw files: skipped without them, failed under CI=true."""
    return require_raw_data(RAW / "ptb.train.txt", "PTB")


@pytest.fixture(scope="session")
def ptb(tmp_path_factory) -> PTBLanguageModel:
    problem = PTBLanguageModel(data_dir=tmp_path_factory.mktemp("ptb_data"), raw_dir=RAW)
    problem.prepare()
    return problem


def test_registered_and_spec():
    problem = problems.get("ptb_lm")(data_dir="unused", raw_dir=RAW)
    spec = problem.spec(HParams(max_length=0))
    assert (spec.task, spec.input_vocab_size, spec.target_vocab_size) == ("lm", 10000, 10000)
    assert spec.streamed and spec.pad_id == -1 and spec.max_input_length == 35
    assert problem.spec(HParams(max_length=20)).max_target_length == 20


def test_vocab_and_token_counts(ptb):
    assert len(ptb.vocab) == 10000 and len(set(ptb.vocab)) == 10000 and "<eos>" in ptb.vocab
    assert {s: len(ptb.tokens(s)) for s in ("train", "valid", "test")} == PTB_TOKENS
    train = np.asarray(ptb.tokens("train"))
    assert train.min() == 0 and train.max() == 9999
    counts = np.bincount(train, minlength=10000)
    order = sorted(range(10000), key=lambda i: (-counts[i], ptb.vocab[i]))
    assert order == list(range(10000))  # ids sorted by (-count, word)


def test_streams_decode_to_the_text(ptb):
    for split in ("train", "valid", "test"):
        words = read_words(RAW / f"ptb.{split}.txt")
        assert ptb.decode(ptb.tokens(split)[:300]).split() == words[:300]
        assert ptb.decode(ptb.tokens(split)[-50:]).split() == words[-50:]


def test_windows_are_contiguous_streams(ptb):
    hp = HParams(batch_size=20, max_length=35)
    reader = ptb.reader("train", hp)
    n = len(ptb.tokens("train"))
    assert len(reader) == (n // 20 - 1) // 35
    data = np.asarray(ptb.tokens("train"))[: 20 * (n // 20)].reshape(20, -1)
    batches = list(reader)
    assert len(batches) == len(reader)
    for i in (0, 1, len(batches) - 1):
        b = batches[i]
        assert b["inputs"].dtype == torch.int64 and b["inputs"].shape == (20, 35)
        assert np.array_equal(b["inputs"].numpy(), data[:, i * 35:(i + 1) * 35])
        assert np.array_equal(b["targets"].numpy(), data[:, i * 35 + 1:(i + 1) * 35 + 1])
    for prev, nxt in zip(batches, batches[1:4]):
        assert torch.equal(prev["inputs"][:, 1:], prev["targets"][:, :-1])
        assert torch.equal(nxt["inputs"][:, 0], prev["targets"][:, -1])


def test_eval_batch_size_override(ptb):
    reader = ptb.reader("valid", HParams(batch_size=20), batch_size=1, num_steps=35)
    first = next(iter(reader))
    assert first["inputs"].shape == (1, 35)
    assert len(reader) == (73_760 - 1) // 35
    with pytest.raises(ValueError, match="cannot be shuffled"):
        ptb.reader("train", HParams(), shuffle=True)


def test_resume_mid_epoch_yields_exactly_the_rest(ptb):
    hp = HParams(batch_size=8, max_length=20)
    full = list(ptb.reader("valid", hp))
    reader = ptb.reader("valid", hp)
    it = iter(reader)
    for _ in range(17):
        next(it)
    state = reader.state_dict()
    assert state == {"epoch": 0, "position": 17}
    resumed = ptb.reader("valid", hp)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 17
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(rest, full[17:]))
    assert resumed.state_dict() == {"epoch": 1, "position": 0}


def test_prepare_is_idempotent(ptb):
    manifest = ptb.data_dir / "manifest.json"
    before = manifest.stat().st_mtime_ns
    ptb.prepare()
    assert manifest.stat().st_mtime_ns == before


def _copy_prepared(ptb, tmp_path) -> PTBLanguageModel:
    data = tmp_path / "data"
    shutil.copytree(ptb.data_dir, data)
    return PTBLanguageModel(data_dir=data, raw_dir=RAW)


def test_truncated_shard_names_the_file(ptb, tmp_path):
    copy = _copy_prepared(ptb, tmp_path)
    shard = copy.data_dir / "valid.tokens.npy"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"valid\.tokens\.npy.*truncated"):
        copy.reader("valid", HParams())


def test_corrupt_shard_names_the_file(ptb, tmp_path):
    copy = _copy_prepared(ptb, tmp_path)
    shard = copy.data_dir / "test.tokens.npy"
    raw = bytearray(shard.read_bytes())
    raw[-7] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=r"test\.tokens\.npy.*corrupt"):
        copy.tokens("test")
    copy.prepare()  # datagen repairs it
    assert np.array_equal(np.asarray(copy.tokens("test")), np.asarray(ptb.tokens("test")))


def test_raw_md5_mismatch_is_a_clear_error(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        shutil.copy(RAW / f"ptb.{split}.txt", raw)
    (raw / "ptb.valid.txt").write_text("not the ptb file\n")
    with pytest.raises(ChecksumError, match=r"ptb\.valid\.txt.*md5"):
        PTBLanguageModel(data_dir=tmp_path / "data", raw_dir=raw).prepare()


@pytest.mark.timeout(30)
def test_download_from_local_mirror(http_dir, tmp_path):
    www, url = http_dir
    for split in ("train", "valid", "test"):
        shutil.copy(RAW / f"ptb.{split}.txt", www)
    paths = fetch_ptb(tmp_path / "raw", base_urls=[url], tarball_url=None)
    assert sorted(p.name for p in paths.values()) == ["ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    assert not list((tmp_path / "raw").glob("*.part"))


@pytest.mark.timeout(30)
def test_download_checksum_mismatch_fails(http_dir, tmp_path):
    www, url = http_dir
    for split in ("train", "valid", "test"):
        shutil.copy(RAW / f"ptb.{split}.txt", www)
    (www / "ptb.test.txt").write_text("tampered\n")
    with pytest.raises(DataError, match=r"ptb\.test\.txt.*md5"):
        fetch_ptb(tmp_path / "raw", base_urls=[url], tarball_url=None)
    assert not (tmp_path / "raw" / "ptb.test.txt").exists()
    assert not list((tmp_path / "raw").glob("*.part"))


@pytest.mark.timeout(30)
def test_download_from_tarball(http_dir, tmp_path):
    www, url = http_dir
    with tarfile.open(www / "simple-examples.tgz", "w:gz") as tar:
        for split in ("train", "valid", "test"):
            tar.add(RAW / f"ptb.{split}.txt", arcname=f"./simple-examples/data/ptb.{split}.txt")
    paths = fetch_ptb(tmp_path / "raw", base_urls=[url + "missing/"], tarball_url=url + "simple-examples.tgz")
    assert all(p.is_file() for p in paths.values())
