"""Multi30k de->en: datagen, sizes, subword ids, bucketed batches, resume, checksums, download."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
import torch

import sentencepiece  # noqa: F401,E402 - in the [test] extra: a missing one is a failure, not a skip

from helpers import raw_data_dir, require_raw_data  # noqa: E402
from hotloop.data import ChecksumError, DataError  # noqa: E402
from hotloop.hparams import get_hparams  # noqa: E402
from hotloop.problems.multi30k import MULTI30K_PAIRS, MULTI30K_SHA256, Multi30kDeEn, fetch_multi30k  # noqa: E402
from hotloop.registry import problems  # noqa: E402

RAW = raw_data_dir("multi30k")


@pytest.fixture(scope="session", autouse=True)
def m30k_raw_data() -> Path:
    """Every test here needs the raw files: skipped without them, failed under CI=true."""
    return require_raw_data(RAW / "train.de.gz", "Multi30k")


@pytest.fixture(scope="session")
def m30k(tmp_path_factory) -> Multi30kDeEn:
    problem = Multi30kDeEn(data_dir=tmp_path_factory.mktemp("m30k_data"), raw_dir=RAW)
    problem.prepare()
    return problem


def _hp(**kw):
    return get_hparams("transformer_multi30k", kw)


def test_registered_with_default_hparams():
    cls = problems.get("translate_multi30k_de_en")
    assert cls.default_hparams == "transformer_multi30k"
    spec = cls(data_dir="unused").spec(_hp())
    assert spec.task == "seq2seq" and spec.input_vocab_size == spec.target_vocab_size == 8000
    assert spec.pad_id == 0 and not spec.streamed


def test_split_sizes_and_eos(m30k):
    for split, pairs in MULTI30K_PAIRS.items():
        batches = list(m30k.reader(split, _hp()))
        assert sum(b["inputs"].shape[0] for b in batches) == pairs
        for b in batches[:3]:
            assert b["inputs"].dtype == torch.int64 and b["targets"].dtype == torch.int64
            lengths = (b["targets"] != 0).sum(1)
            assert torch.all(b["targets"][torch.arange(len(lengths)), lengths - 1] == 1)  # EOS last


def test_vocab_reserves_pad_and_eos_and_round_trips(m30k):
    enc = m30k.encoder
    assert enc.vocab_size == 8000
    ids = enc.encode("A man is riding a bicycle.")
    assert ids[-1] == 1 and 0 not in ids[:-1] and 1 not in ids[:-1]
    assert m30k.decode(ids + [0, 0]) == "A man is riding a bicycle."
    first = gzip.open(RAW / "val.en.gz", "rt", encoding="utf-8").readline().strip()
    valid = list(m30k.reader("valid", _hp()))
    decoded = {m30k.decode(row) for b in valid for row in b["targets"]}
    assert first in decoded


def test_token_budget_and_shuffle_per_epoch(m30k):
    hp = _hp(batch_tokens=1024)
    reader = m30k.reader("train", hp)
    first = list(reader)
    for b in first:
        for key in ("inputs", "targets"):
            assert b[key].numel() <= 1024
    assert sum(b["inputs"].shape[0] for b in first) == 29_000
    second = list(reader)  # epoch 1: reshuffled
    assert not torch.equal(first[0]["inputs"], second[0]["inputs"])
    again = list(m30k.reader("train", hp))
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(first, again))


def test_resume_mid_epoch(m30k):
    hp = _hp(batch_tokens=2048)
    full = list(m30k.reader("train", hp, seed=3))
    reader = m30k.reader("train", hp, seed=3)
    it = iter(reader)
    for _ in range(25):
        next(it)
    state = reader.state_dict()
    resumed = m30k.reader("train", hp, seed=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 25
    assert all(torch.equal(a["targets"], b["targets"]) for a, b in zip(rest, full[25:]))


def test_prepare_idempotent_and_truncated_shard(m30k, tmp_path):
    manifest = m30k.data_dir / "manifest.json"
    before = manifest.stat().st_mtime_ns
    m30k.prepare()
    assert manifest.stat().st_mtime_ns == before
    copy = tmp_path / "copy"
    shutil.copytree(m30k.data_dir, copy)
    shard = copy / "valid.targets.tokens.npy"
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(DataError, match=r"valid\.targets\.tokens\.npy"):
        Multi30kDeEn(data_dir=copy, raw_dir=RAW).reader("valid", _hp())


def test_raw_checksum_mismatch(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(RAW, raw)
    (raw / "val.en.gz").chmod(0o644)
    (raw / "val.en.gz").write_bytes(gzip.compress(b"changed\n"))
    with pytest.raises(ChecksumError, match=r"val\.en\.gz"):
        fetch_multi30k(raw)


@pytest.mark.timeout(30)
def test_download_from_local_mirror_and_mismatch(http_dir, tmp_path):
    www, url = http_dir
    for name in MULTI30K_SHA256:
        shutil.copy(RAW / name, www)
    paths = fetch_multi30k(tmp_path / "ok", base_url=url)
    assert sorted(p.name for p in paths.values()) == sorted(MULTI30K_SHA256)
    (www / "test_2016_flickr.de.gz").write_bytes(b"not gzip")
    with pytest.raises(ChecksumError, match="test_2016_flickr.de.gz"):
        fetch_multi30k(tmp_path / "bad", base_url=url)
    assert not (tmp_path / "bad" / "test_2016_flickr.de.gz").exists()


def test_accumulation_weights_every_token_equally(m30k):
    """accum_steps=2 over two bucketed batches with different token counts == one batch of both."""
    import torch.nn.functional as F

    from hotloop.engine import Strategy, build_step
    from hotloop.registry import models
    from hotloop.compose.build import build_model
    hp = _hp(hidden_size=32, num_layers=1, num_heads=2, filter_size=64, dropout=0.0, label_smoothing=0.0,
             optimizer="sgd", learning_rate=0.5, max_grad_norm=0.0, batch_tokens=600)
    it = iter(m30k.reader("train", hp, shuffle=False))
    first, second = next(it), next(it)
    assert (first["targets"] != 0).sum() != (second["targets"] != 0).sum()      # unequal token counts
    width = {k: max(first[k].shape[1], second[k].shape[1]) for k in ("inputs", "targets")}
    both = {k: torch.cat([F.pad(b[k], (0, width[k] - b[k].shape[1])) for b in (first, second)])
            for k in ("inputs", "targets")}
    params = []
    for micro in ([first, second], [both]):
        model = build_model(models.get("transformer"), hp, m30k.spec(hp))
        result = build_step(model, hp, Strategy(fused_optimizer=False)).step([dict(b) for b in micro])
        params.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        assert int(result.stats["tokens"]) == int((both["targets"] != 0).sum())
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=2e-6)
    # the per-micro-batch mean divided by k (equal weights) is measurably different
    model = build_model(models.get("transformer"), hp, m30k.spec(hp))
    initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert (params[1] - initial).abs().max() > 1e-3
