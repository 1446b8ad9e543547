"""safetensors export: identical outputs after the round trip, and clear errors for bad files."""
from __future__ import annotations

import json

import pytest
import torch

from export_helpers import tiny_model

from hotloop.export import ExportError, ExportFileError, export_model, load_model
from hotloop.export.graphs import example_inputs, forward_graph


def _outputs(model, inputs):
    graph, _ = forward_graph(model)
    with torch.no_grad():
        out = graph(*inputs)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", ["conv_net", "lstm_lm", "transformer"])
def test_round_trip_gives_identical_outputs(tmp_path, name):
    model = tiny_model(name)
    export_model(model, "safetensors", tmp_path / "st", model_name=name, problem_name="not_registered_problem")
    loaded = load_model(tmp_path / "st")
    fresh = tiny_model(name, seed=1)          # same architecture, other weights: the reference must differ
    inputs = example_inputs(model, 3, 6, seed=4)
    expected, got, other = _outputs(model, inputs), _outputs(loaded, inputs), _outputs(fresh, inputs)
    assert not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert not all(torch.equal(a, b) for a, b in zip(expected, other))


def test_only_weights_and_config_are_written(tmp_path):
    model = tiny_model("conv_net")
    result = export_model(model, "safetensors", tmp_path / "st", model_name="conv_net")
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["config.json", "model.safetensors"]
    from safetensors import safe_open
    with safe_open(str(tmp_path / "st" / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == sorted(model.state_dict())
    config = json.loads((tmp_path / "st" / "config.json").read_text())
    assert config["model"] == "conv_net" and config["spec"]["task"] == "classify"
    assert config["hparams"]["conv_channels"] == [4, 8]
    assert result.files == ["config.json", "model.safetensors"]


@pytest.fixture
def st_dir(tmp_path):
    export_model(tiny_model("conv_net"), "safetensors", tmp_path / "st", model_name="conv_net")
    return tmp_path / "st"


def test_truncated_weights_name_the_file(st_dir):
    weights = st_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ExportFileError, match=r"model\.safetensors.*truncated"):
        load_model(st_dir)


def test_corrupt_weights_name_the_file(st_dir):
    weights = st_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportFileError, match=r"model\.safetensors.*corrupt"):
        load_model(st_dir)


def test_corrupt_safetensors_header_names_the_file(st_dir):
    """A file that passes the digest (manifest rewritten) but is not safetensors still names the file."""
    weights = st_dir / "model.safetensors"
    weights.write_bytes(b"\x00" * 64)
    config = json.loads((st_dir / "config.json").read_text())
    import hashlib
    config["files"]["model.safetensors"] = {"sha256": hashlib.sha256(b"\x00" * 64).hexdigest(), "bytes": 64}
    (st_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportFileError, match=r"model\.safetensors: cannot load"):
        load_model(st_dir)


def test_truncated_config_names_the_file(st_dir):
    config = st_dir / "config.json"
    config.write_text(config.read_text()[:50])
    with pytest.raises(ExportFileError, match=r"config\.json.*unreadable"):
        load_model(st_dir)


def test_unregistered_model_asks_for_import(st_dir):
    config = json.loads((st_dir / "config.json").read_text())
    config["model"] = "my_user_net"
    (st_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match=r"'my_user_net'.*--import"):
        load_model(st_dir)
