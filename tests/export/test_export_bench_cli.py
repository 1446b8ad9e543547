"""``hotloop export`` and ``hotloop bench`` through run(Namespace); the bench's parity rule and JSON schema."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from export_helpers import save_run, tiny_model

from hotloop.cli import bench as bench_cli
from hotloop.cli import export as export_cli
from hotloop.errors import UserError
from hotloop.export import load_model, load_runtime
from hotloop.export.bench import ROW_KEYS, Contender, format_rows, parity, run_bench
from hotloop.export.bench_models import subject_from_model
from hotloop.export.graphs import example_inputs, forward_graph
from hotloop.models.conv import ConvNet
from hotloop.registry import models
from hotloop.compose.restore import find_checkpoint, load_trained


def _args(module, **values) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in values.items():
        setattr(args, key, value)
    return args


def _checkpoint_model(run_dir):
    return load_trained(find_checkpoint(run_dir), prepare=False).model


def test_export_cli_safetensors_and_openvino(conv_run, tmp_path, capsys):
    assert export_cli.run(_args(export_cli, output_dir=str(conv_run), format="safetensors",
                                out=str(tmp_path / "st"))) == 0
    reference = _checkpoint_model(conv_run)
    images = example_inputs(reference, 3, seed=9)[0]
    graph, _ = forward_graph(reference)
    with torch.no_grad():
        expected = graph(images)
    loaded_graph, _ = forward_graph(load_model(tmp_path / "st"))
    with torch.no_grad():
        assert torch.equal(loaded_graph(images), expected)

    assert export_cli.run(_args(export_cli, output_dir=str(conv_run), format="openvino")) == 0
    default_out = conv_run / "export" / "openvino"
    assert {"model.xml", "model.bin", "config.json"} <= {p.name for p in default_out.iterdir()}
    runner = load_runtime(default_out, "openvino", precision="fp32")
    assert (torch.from_numpy(runner([images.numpy()])[0]) - expected).abs().max().item() <= 1e-4
    assert "with the dynamo exporter" in capsys.readouterr().out


def test_export_of_unregistered_model_asks_for_import(tmp_path):
    class UserConv(ConvNet):
        pass

    models.add("user_conv_for_export_test", UserConv)
    try:
        run_dir = save_run(tmp_path / "run", "image_synthetic", "user_conv_for_export_test", "conv_net_base",
                           "conv_channels=4,image_size=8")
    finally:
        models.unregister("user_conv_for_export_test")
    with pytest.raises(UserError, match=r"model 'user_conv_for_export_test'.*--import"):
        export_cli.run(_args(export_cli, output_dir=str(run_dir), format="safetensors", out=str(tmp_path / "o")))


def test_parity_rule_hand_computed():
    ref = [torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])]
    diff, agree, ok = parity(ref, [np.array([[1.0, 2.0, 3.00005], [3.0, 2.0, 1.0]], dtype=np.float32)], "fp32")
    assert ok and agree == 1.0 and diff == pytest.approx(5e-5, abs=2e-6)
    diff, agree, ok = parity(ref, [np.array([[1.0, 2.0, 3.0002], [1.0, 2.0, 3.0]], dtype=np.float32)], "fp32")
    assert not ok and agree == 0.5 and diff == pytest.approx(2.0)
    # bf16: 5% of the largest eager logit magnitude (3.0) -> 0.15
    assert parity(ref, [np.array([[1.1, 2.0, 3.0], [3.0, 2.0, 1.0]], dtype=np.float32)], "bf16")[2]
    assert not parity(ref, [np.array([[1.2, 2.0, 3.0], [3.0, 2.0, 1.0]], dtype=np.float32)], "bf16")[2]


def _offset(delta: float):
    def make(subject, workdir, threads):
        graph, _ = subject.graph()
        return lambda inputs: [graph(*inputs) + delta]
    return make


def _broken(subject, workdir, threads):
    def run(inputs):
        raise RuntimeError("kernel exploded")
    return run


def test_failed_parity_is_shown_as_failed_not_fast():
    subject = subject_from_model("conv_net", tiny_model("conv_net"))
    contenders = [Contender("torch", "fp32", _offset(0.0)), Contender("wrong", "fp32", _offset(1e-3)),
                  Contender("close-bf16", "bf16", _offset(1e-3)), Contender("broken", "fp32", _broken)]
    rows = run_bench([subject], [2], contenders=contenders, threads=1, rounds=2, min_round_s=0.0,
                     log=lambda _msg: None)
    by_runtime = {r.runtime: r for r in rows}
    wrong = by_runtime["wrong"]
    assert not wrong.parity_ok and wrong.samples_per_s is None and wrong.speedup_vs_eager is None
    assert wrong.max_abs_diff == pytest.approx(1e-3, rel=1e-3) and "parity failed" in wrong.error
    assert by_runtime["close-bf16"].parity_ok and by_runtime["close-bf16"].samples_per_s > 0
    assert by_runtime["broken"].samples_per_s is None and "kernel exploded" in by_runtime["broken"].error
    assert by_runtime["torch"].speedup_vs_eager == pytest.approx(1.0)
    table = format_rows(rows)
    assert [line.split()[4] for line in table.splitlines()[1:] if line.split()[1] in ("wrong", "broken")] \
        == ["FAILED", "FAILED"]


def test_bench_cli_writes_the_json_schema(tmp_path, capsys):
    path = tmp_path / "bench.json"
    args = _args(bench_cli, models="conv_net", batches="1,2", override="conv_channels=4:8,image_size=8",
                 runtimes="torch,onnxruntime", threads=1, rounds=1, json=str(path))
    assert bench_cli.run(args) == 0
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert [(r["runtime"], r["batch"]) for r in rows] == [("torch", 1), ("onnxruntime", 1), ("torch", 2),
                                                          ("onnxruntime", 2)]
    for row in rows:
        assert set(ROW_KEYS) <= set(row) and row["model"] == "conv_net" and row["precision"] == "fp32"
        assert row["parity_ok"] is True and row["max_abs_diff"] <= 1e-4
        assert row["samples_per_s"] > 0 and row["latency_ms"] > 0
        assert row["samples_per_s"] == pytest.approx(row["batch"] * 1e3 / row["latency_ms"])
    assert data["environment"]["threads"] == 1
    out = capsys.readouterr().out
    assert "AMX:" in out and "threads per runtime: 1" in out


def test_bench_cli_bad_flags():
    with pytest.raises(UserError, match="--batches"):
        bench_cli.run(_args(bench_cli, models="conv_net", batches="1,x"))
    with pytest.raises(UserError, match="--runtimes: unknown tensorflow"):
        bench_cli.run(_args(bench_cli, models="conv_net", runtimes="tensorflow"))


def test_missing_extra_gives_the_install_hint(monkeypatch, tmp_path):
    import sys

    from hotloop.export import MissingExtraError, export_model
    monkeypatch.setitem(sys.modules, "openvino", None)       # import openvino -> ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'hotloop\[export\]'"):
        export_model(tiny_model("conv_net"), "openvino", tmp_path / "ov", model_name="conv_net")


def test_bench_cli_on_a_trained_run(conv_run, tmp_path):
    path = tmp_path / "run.json"
    args = _args(bench_cli, output_dir=str(conv_run), batches="2", runtimes="torch", threads=1, rounds=1,
                 json=str(path))
    assert bench_cli.run(args) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [(r["model"], r["runtime"], r["batch"], r["parity_ok"]) for r in rows] == [("conv_net", "torch", 2, True)]
