"""ONNX and OpenVINO exports: outputs match eager within 1e-4 at other shapes; bad graphs and files fail clearly."""
from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from torch import Tensor

from export_helpers import tiny_model

from hotloop.export import (DataDependentControlFlowError, ExportFileError, export_model,
                            load_runtime, read_manifest)
from hotloop.export.graphs import example_inputs, forward_graph
from hotloop.export.runtimes import onnx_runner, openvino_runner
from hotloop.models.conv import ConvNet
from hotloop.models.formulation import Formulation

TOL = 1e-4
# lstm_lm computes with lstm_impl=bptt: the export must switch to the fused nn.LSTM formulation
# (same weights, dynamic time axis)
OVERRIDES = {"lstm_lm": "hidden_size=16,num_layers=2"}
FORMULATION = {"lstm_lm": Formulation(lstm_impl="bptt")}
EXPECTED_EXPORTER = {"conv_net": "dynamo", "lstm_lm": "torchscript", "transformer": "dynamo"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Any]:
    """Each tiny model exported once as ONNX (lstm_lm also as OpenVINO IR; the IR of the others is read
    from their ONNX files, and the CLI test exports conv_net as IR: fewer slow dynamo exports)."""
    root = tmp_path_factory.mktemp("exports")
    out: dict[str, Any] = {}
    for name in ("conv_net", "lstm_lm", "transformer"):
        model = tiny_model(name, OVERRIDES.get(name))
        if name in FORMULATION:
            model.use_formulation(FORMULATION[name])
        export_model(model, "onnx", root / f"{name}-onnx", model_name=name, graphs=("forward",),
                     log=lambda _msg: None)
        if name == "lstm_lm":
            export_model(model, "openvino", root / f"{name}-ov", model_name=name, log=lambda _msg: None)
        out[name] = model
    out["root"] = root
    return out


def _eager(model, inputs) -> tuple[Tensor, ...]:
    graph, _ = forward_graph(model)
    with torch.no_grad():
        result = graph(*inputs)
    return result if isinstance(result, tuple) else (result,)


def _max_diff(expected, got) -> float:
    assert len(expected) == len(got)
    worst = 0.0
    for e, g in zip(expected, got):
        assert tuple(g.shape) == tuple(e.shape)
        worst = max(worst, (torch.from_numpy(g) - e).abs().max().item())
    return worst


NAMES = ["conv_net", "lstm_lm", "transformer"]


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_matches_eager_at_new_shapes(exported, name):
    model = exported[name]
    runner = load_runtime(exported["root"] / f"{name}-onnx", "onnxruntime")
    for batch, seq in ((5, 9), (1, 2)):
        inputs = example_inputs(model, batch, seq, seed=11)
        assert _max_diff(_eager(model, inputs), runner([t.numpy() for t in inputs])) <= TOL
    manifest = read_manifest(exported["root"] / f"{name}-onnx")
    assert manifest["graphs"]["forward"]["exporter"] == EXPECTED_EXPORTER[name]


@pytest.mark.parametrize("name", NAMES)
def test_openvino_f32_matches_eager_at_new_shapes(exported, name):
    model = exported[name]
    if name == "lstm_lm":
        runner = load_runtime(exported["root"] / f"{name}-ov", "openvino", precision="fp32")
    else:
        runner = openvino_runner(exported["root"] / f"{name}-onnx" / "model.onnx", precision="fp32")
    inputs = example_inputs(model, 4, 6, seed=12)
    assert _max_diff(_eager(model, inputs), runner([t.numpy() for t in inputs])) <= TOL


def test_graph_names_and_lstm_state(exported):
    manifest = read_manifest(exported["root"] / "lstm_lm-onnx")
    graph = manifest["graphs"]["forward"]
    assert graph["inputs"] == ["tokens", "state0", "state1"]
    assert graph["outputs"] == ["logits", "state0_out", "state1_out"]
    model = exported["lstm_lm"]
    runner = load_runtime(exported["root"] / "lstm_lm-onnx", "onnxruntime")
    tokens, h, c = example_inputs(model, 2, 4, seed=3)
    # carrying the state through two 2-step calls equals one 4-step call
    _, h1, c1 = runner([tokens[:, :2].numpy(), h.numpy(), c.numpy()])
    logits2, _, _ = runner([tokens[:, 2:].numpy(), h1, c1])
    full = _eager(model, (tokens, h, c))[0]
    assert (torch.from_numpy(logits2) - full[:, 2:]).abs().max().item() <= TOL


def test_truncated_onnx_file_is_named(exported, tmp_path):
    copy = tmp_path / "conv"
    shutil.copytree(exported["root"] / "conv_net-onnx", copy)
    onnx_file = copy / "model.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[: onnx_file.stat().st_size // 2])
    with pytest.raises(ExportFileError, match=r"model\.onnx.*truncated"):
        load_runtime(copy, "onnxruntime")
    with pytest.raises(ExportFileError, match=r"model\.onnx: not a loadable ONNX model"):
        onnx_runner(onnx_file)


def test_corrupt_openvino_files_are_named(exported, tmp_path):
    copy = tmp_path / "ov"
    shutil.copytree(exported["root"] / "lstm_lm-ov", copy)
    xml = copy / "model.xml"
    xml.write_text(xml.read_text()[:200])
    with pytest.raises(ExportFileError, match=r"model\.xml.*truncated"):
        load_runtime(copy, "openvino")
    with pytest.raises(ExportFileError, match=r"model\.xml: not a loadable"):
        openvino_runner(xml)


class BranchyNet(ConvNet):
    """Python control flow on a tensor value: no static graph can hold it."""

    def forward(self, batch, state=None):
        x = batch["inputs"]
        if x.mean() > 0:
            x = x * 2
        return super().forward({"inputs": x}, state)


def test_data_dependent_control_flow_names_op_and_fallback(tmp_path):
    base = tiny_model("conv_net")
    export_model(base, "safetensors", tmp_path / "out", model_name="conv_net")   # an earlier export
    model = BranchyNet(base.hp, base.spec).eval()
    with pytest.raises(DataDependentControlFlowError) as info:
        export_model(model, "onnx", tmp_path / "out", model_name="branchy", log=lambda _msg: None)
    message = str(info.value)
    assert "test_onnx_openvino.py" in message and "x.mean() > 0" in message
    assert "aten." in message                       # the op
    assert "TorchScript fallback" in message        # the fallback, and why it is not used
    # the failed export leaves the earlier one as it was, and no partial directory
    assert read_manifest(tmp_path / "out")["format"] == "safetensors"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_explicit_torchscript_names_the_traced_branch(tmp_path):
    """Asked for the TorchScript exporter, a value-dependent branch is named: as an error when the check
    inputs take the other branch, else as a logged warning."""
    base = tiny_model("conv_net")
    model = BranchyNet(base.hp, base.spec).eval()
    logged: list[str] = []
    try:
        export_model(model, "onnx", tmp_path / "out", model_name="branchy", exporter="torchscript",
                     log=logged.append)
        message = " ".join(logged)
    except DataDependentControlFlowError as exc:
        message = str(exc)
    assert "test_onnx_openvino.py" in message and "x.mean() > 0" in message
