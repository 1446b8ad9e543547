"""Strategy validation, model checks and device flags."""
import pytest
import torch
from torch import nn

from hotloop.engine import Strategy, StrategyError, build_step
from hotloop.engine.build import compile_step
from hotloop.hparams import HParams
from hotloop.engine.flags import apply_device_flags, current_flags


@pytest.mark.parametrize("fields, message", [
    (dict(precision="fp16"), "fp16 needs CUDA"),
    (dict(tf32=True), "tf32=True needs a CUDA device"),
    (dict(cudnn_benchmark=True), "cudnn_benchmark=True needs a CUDA device"),
    (dict(graph_passes=True), "set backend=graph"),
    (dict(inplace=True, backend="inductor"), "inplace=True"),
    (dict(executor="parallel"), "executor=parallel"),
    (dict(cuda_graphs=True, backend="graph"), "cuda_graphs"),
    (dict(fast_math=True, backend="graph"), "fast_math=True"),
    (dict(backend="graph", graph_passes=True, disabled_passes=("nope",)), "unknown pass"),
    (dict(backend="jit"), "choose one of"),
    (dict(sync_every=0), "sync_every"),
])
def test_invalid_or_inapplicable_fields_are_rejected(fields, message):
    with pytest.raises(StrategyError, match=message):
        Strategy(**fields).validate("cpu")


def test_valid_graph_strategy_passes_and_overrides_parse():
    s = Strategy.parse("backend=graph,graph_passes=true,executor=parallel,disabled_passes=dce:unbind_slices")
    assert s.validate("cpu") is s
    assert s.disabled_passes == ("dce", "unbind_slices")
    with pytest.raises(StrategyError, match="unknown strategy field"):
        Strategy.parse("backendd=graph")


class _SparseModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.out = nn.Linear(4, 2)


def _sgd(params, fused):
    return torch.optim.SGD(params, lr=0.1)


def test_fused_optimizer_with_sparse_gradients_is_an_error():
    model = _SparseModel()
    with pytest.raises(StrategyError, match="sparse gradients.*emb"):
        build_step(model, HParams(), Strategy(fused_optimizer=True), optimizer=_sgd)
    build_step(model, HParams(), Strategy(fused_optimizer=False), optimizer=_sgd)  # allowed


def test_channels_last_without_convolutions_is_an_error():
    with pytest.raises(StrategyError, match="channels_last"):
        build_step(nn.Linear(3, 3), HParams(), Strategy(channels_last=True), optimizer=_sgd)


def test_strategy_parses_overrides_and_files_with_one_set_of_checks(tmp_path):
    assert Strategy.parse_overrides("precision=bf16,prefetch=3") == {"precision": "bf16", "prefetch": 3}
    path = tmp_path / "s.json"
    path.write_text('{"disabled_passes": ["dce"], "graph_passes": true, "backend": "graph"}')
    assert Strategy.from_file(path) == Strategy(disabled_passes=("dce",), graph_passes=True, backend="graph")
    path.write_text('{"prefetch": "many"}')
    with pytest.raises(StrategyError, match="strategy file .*prefetch"):
        Strategy.from_file(path)
    with pytest.raises(StrategyError, match="unknown strategy field 'precison'"):
        Strategy.parse("precison=bf16")


def test_compile_step_wires_fused_optimizer_flag():
    model = nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1, foreach=False)
    step = compile_step(model, None, opt, Strategy(fused_optimizer=True))
    assert opt.param_groups[0]["foreach"] is True
    assert any("foreach: False -> True" in line for line in step.report)
    compile_step(model, None, opt, Strategy(fused_optimizer=False))
    assert opt.param_groups[0]["foreach"] is False


def test_apply_device_flags_sets_reports_and_is_idempotent():
    before = current_flags()
    try:
        target = 1 if before["intra_op_threads"] != 1 else 2
        s = Strategy(intra_op_threads=target, onednn=True)
        first = apply_device_flags(s, "cpu")
        assert first.changed["intra_op_threads"] == (before["intra_op_threads"], target)
        assert torch.get_num_threads() == target
        second = apply_device_flags(s, "cpu")
        assert not second.changed
        assert second.unchanged["intra_op_threads"] == target
        assert any("intra_op_threads" in line for line in second.lines())
    finally:
        torch.set_num_threads(before["intra_op_threads"])
        torch.backends.mkldnn.enabled = before["mkldnn.enabled"]


def test_apply_device_flags_rejects_cuda_flags_on_cpu():
    with pytest.raises(StrategyError, match="tf32"):
        apply_device_flags(Strategy(tf32=True), "cpu")
