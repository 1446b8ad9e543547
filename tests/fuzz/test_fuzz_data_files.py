"""Fuzzed prepared-data shards, autotune cache files and export directories.

Each is written the way hotloop writes it, then mutated (bytes flipped, truncated, extended,
its JSON edited) and read back the way hotloop reads it. Each gives a result or a one-line
:class:`~hotloop.errors.UserError` (a tune-cache file that fails is ignored with a warning and
tuning runs again); no file is changed by reading.
"""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from fuzz_support import (apply_byte_mutation, apply_json_edit, byte_mutation, field_edit, fuzz_settings,
                          json_edit, result_or_user_error, tree_digest)
from hypothesis import example, given
from hypothesis import strategies as st

from hotloop.data.shards import ShardWriter, manifest_matches, read_manifest
from hotloop.data.sources import from_shards
from hotloop.engine.strategy import Strategy
from hotloop.export.artifacts import load_model, make_manifest, save_safetensors
from hotloop.hparams import get_hparams
from hotloop.problems.base import ProblemSpec
from hotloop.registry import models
from hotloop.tools.tune_cache import TuneCacheWarning, load_choice, save_choice

pytestmark = pytest.mark.timeout(240)
_CONFIG = {"vocab": 7, "raw": "abc"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A prepared directory: one split with two ragged fields, a text file and the manifest."""
    root = tmp_path_factory.mktemp("shards") / "data"
    writer = ShardWriter(root, "toy", _CONFIG)
    rng = np.random.default_rng(0)
    fields = {}
    for field in ("inputs", "targets"):
        lengths = rng.integers(1, 6, size=9)
        writer.add_array(f"train.{field}.tokens.npy", rng.integers(2, 7, size=int(lengths.sum())).astype(np.int32))
        writer.add_array(f"train.{field}.offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        fields[field] = {"tokens": f"train.{field}.tokens.npy", "offsets": f"train.{field}.offsets.npy"}
    writer.add_text("vocab.txt", "a\nb\nc\n")
    writer.finish({"splits": {"train": {"fields": fields}}})
    return root


def _read_split(root, verify):
    source = from_shards(root, "train", verify=verify)
    return [source._get(0, i) for i in range(min(source._num_items(0), 20))]


@fuzz_settings(80)
@given(target=st.sampled_from(["manifest.json", "train.inputs.tokens.npy", "train.inputs.offsets.npy",
                               "vocab.txt"]),
       mutation=st.one_of(byte_mutation(), json_edit(), field_edit(["version", "problem", "config", "files", "meta"])),
       verify=st.booleans())
@example(target="manifest.json", mutation=("set", 0, None, "files"), verify=True)        # found by fuzzing
@example(target="manifest.json", mutation=("set", 0, 3, "meta"), verify=False)
def test_mutated_data_shards(tmp_path_factory, shards, target, mutation, verify):
    root = tmp_path_factory.mktemp("shard_case") / "data"
    shutil.copytree(shards, root)
    path = root / target
    if len(mutation) == 4 and target == "manifest.json":          # a JSON edit of the manifest
        path.write_text(json.dumps(apply_json_edit(json.loads(path.read_text()), mutation)))
    elif len(mutation) == 3:
        path.write_bytes(apply_byte_mutation(path.read_bytes(), mutation))
    before, text = tree_digest(root), (root / "manifest.json").read_bytes().decode("utf-8", "replace")
    result_or_user_error(lambda: read_manifest(root), text)
    assert isinstance(manifest_matches(root, "toy", _CONFIG), bool)
    result_or_user_error(lambda: _read_split(root, verify), text)
    assert tree_digest(root) == before


_KEY = {"version": 1, "model": "m.M", "hparams": "0" * 16, "inputs": {}, "hardware": "h", "device": "cpu",
        "torch": torch.__version__}
_STRATEGY_KEYS = sorted(Strategy().to_dict())


@fuzz_settings(80)
@given(mutation=st.one_of(byte_mutation(), json_edit(), field_edit(["key", "strategy", "table"]),
                          field_edit(_STRATEGY_KEYS).map(lambda e: ("strategy",) + e)))
@example(mutation=("strategy", "set", 0, -(2 ** 63), "onednn"))                            # found by fuzzing
def test_mutated_tune_cache_files(tmp_path_factory, mutation):
    root = tmp_path_factory.mktemp("tune_cache")
    path = save_choice(_KEY, Strategy(intra_op_threads=2, prefetch=1), [{"name": "eager", "seconds": 0.5}], root)
    if len(mutation) == 5:                                        # one strategy field set to an odd value
        record = json.loads(path.read_text())
        record["strategy"] = apply_json_edit(record["strategy"], mutation[1:])
        path.write_text(json.dumps(record))
    elif len(mutation) == 4:
        path.write_text(json.dumps(apply_json_edit(json.loads(path.read_text()), mutation)))
    else:
        path.write_bytes(apply_byte_mutation(path.read_bytes(), mutation))
    before = tree_digest(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuneCacheWarning)
        found = load_choice(_KEY, torch.device("cpu"), root)
    if found is not None:
        strategy, _ = found
        assert Strategy.from_mapping(strategy.to_dict()) == strategy     # every field of its declared type
    assert tree_digest(root) == before


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """A safetensors export of a tiny conv net (``config.json`` + ``model.safetensors``)."""
    out = tmp_path_factory.mktemp("export") / "st"
    hp = get_hparams("conv_net_base", "conv_channels=4:8,image_size=8")
    torch.manual_seed(0)
    model = models.get("conv_net")(hp, ProblemSpec("classify", 0, 10, 0, 1, pad_id=-1)).eval()
    save_safetensors(model, out, make_manifest("safetensors", model, model_name="conv_net", problem_name="x"))
    return out


_EXPORT_KEYS = ["hotloop_export", "format", "model", "hparams", "spec", "files", "graphs", "problem"]


@fuzz_settings(80)
@given(target=st.sampled_from(["config.json", "hparams", "spec", "model.safetensors"]),
       mutation=st.one_of(byte_mutation(), json_edit(), field_edit(_EXPORT_KEYS),
                          field_edit(["conv_channels", "image_size", "hidden_size", "__class__", "dropout",
                                      "task", "input_vocab_size", "target_vocab_size", "pad_id", "streamed"])))
@example(target="config.json", mutation=("set", 0, None, "files"))                         # found by fuzzing
@example(target="config.json", mutation=("set", 0, ["model.safetensors"], "files"))
@example(target="config.json", mutation=("set", 0, None, "spec"))
@example(target="hparams", mutation=("set", 0, 0, "hidden_size"))
def test_mutated_export_directories(tmp_path_factory, export_dir, target, mutation):
    root = tmp_path_factory.mktemp("export_case") / "st"
    shutil.copytree(export_dir, root)
    manifest_file = root / "config.json"
    if target == "model.safetensors" or len(mutation) == 3:
        path = root / ("model.safetensors" if target == "model.safetensors" else "config.json")
        path.write_bytes(apply_byte_mutation(path.read_bytes(), mutation if len(mutation) == 3 else
                                             ("flip", len(str(mutation)), 3)))
    else:
        manifest = json.loads(manifest_file.read_text())
        if target == "config.json":
            manifest = apply_json_edit(manifest, mutation)
        else:
            manifest[target] = apply_json_edit(manifest[target], mutation)
        manifest_file.write_text(json.dumps(manifest))
    before, text = tree_digest(root), manifest_file.read_bytes().decode("utf-8", "replace")
    result_or_user_error(lambda: load_model(root), text)
    assert tree_digest(root) == before
