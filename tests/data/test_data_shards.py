"""Shards and manifests: round trip, memmap, idempotence check, corrupt/truncated files named."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hotloop.data import ChecksumError, DataError, ShardWriter, from_shards, manifest_matches, read_manifest
from hotloop.data.datagen import prepare, write_ragged_split

CONFIG = {"source": "unit-test", "version": 1}


@pytest.fixture
def prepared(tmp_path):
    rng = np.random.default_rng(0)
    inputs = [rng.integers(2, 50, size=rng.integers(1, 9)).tolist() for _ in range(37)]
    targets = [list(reversed(x)) + [1] for x in inputs]
    writer = ShardWriter(tmp_path, "unit", CONFIG)
    meta = write_ragged_split(writer, "train", {"inputs": inputs, "targets": targets})
    writer.finish({"splits": {"train": meta}})
    return tmp_path, inputs, targets


def test_round_trip_is_memory_mapped(prepared):
    data_dir, inputs, targets = prepared
    source = from_shards(data_dir, "train")
    items = list(source)
    assert len(items) == len(source) == 37
    assert [i["inputs"].tolist() for i in items] == inputs
    assert [i["targets"].tolist() for i in items] == targets
    assert isinstance(source._fields["inputs"].tokens.base, np.memmap)
    batches = list(from_shards(data_dir, "train").batch(8))
    assert batches[0]["inputs"].shape[0] == 8 and int(batches[0]["inputs"][0, len(inputs[0]):].sum()) == 0


def test_manifest_matches_only_the_same_config(prepared):
    data_dir, *_ = prepared
    assert manifest_matches(data_dir, "unit", CONFIG)
    assert not manifest_matches(data_dir, "unit", {**CONFIG, "version": 2})
    assert not manifest_matches(data_dir, "other", CONFIG)
    (data_dir / "train.targets.offsets.npy").write_bytes(b"")
    assert not manifest_matches(data_dir, "unit", CONFIG)


def test_missing_manifest_and_split_are_clear(tmp_path, prepared):
    with pytest.raises(DataError, match="no manifest.*datagen"):
        from_shards(tmp_path / "nowhere", "train")
    data_dir, *_ = prepared
    with pytest.raises(DataError, match="no split 'valid'"):
        from_shards(data_dir, "valid")
    (data_dir / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json.*unreadable"):
        read_manifest(data_dir)


def test_truncated_and_corrupt_shards_name_the_file(prepared):
    data_dir, *_ = prepared
    tokens = data_dir / "train.inputs.tokens.npy"
    good = tokens.read_bytes()
    tokens.write_bytes(good[:-4])
    with pytest.raises(DataError, match=r"train\.inputs\.tokens\.npy.*truncated"):
        from_shards(data_dir, "train")
    corrupt = bytearray(good)
    corrupt[-1] ^= 0x55
    tokens.write_bytes(bytes(corrupt))
    with pytest.raises(ChecksumError, match=r"train\.inputs\.tokens\.npy.*corrupt"):
        from_shards(data_dir, "train")
    source = from_shards(data_dir, "train", verify=False)  # size-only check when asked
    assert len(source) == 37


def test_bad_header_with_matching_manifest_is_a_data_error(prepared):
    data_dir, *_ = prepared
    path = data_dir / "train.targets.tokens.npy"
    path.write_bytes(b"X" * path.stat().st_size)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    from hotloop.data import file_digest
    manifest["files"][path.name]["sha256"] = file_digest(path)
    (data_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"train\.targets\.tokens\.npy.*not a readable"):
        from_shards(data_dir, "train")


def test_datagen_prepare_by_name_for_generated_problems():
    assert prepare("algorithmic_copy") is None  # nothing to write; must not fail
