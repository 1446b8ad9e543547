"""Strategy.linear_gemm: nn.Linear's GEMMs from oneDNN's convolution, the same math in another order."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hotloop.engine.build import build_step
from hotloop.engine.linear_formulations import FormulatedLinear, linear_gemm_options, linear_sites, use_linear_gemm
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput
from hotloop.models.formulation import ONEDNN_LINEAR_OPTION, FormulationError
from hotloop.ops.linear_gemm import linear
from hotloop.tools.hardware import HardwareInfo
from hotloop.tools.proposals import formulation_proposals

pytestmark = pytest.mark.usefixtures("one_thread")


class _AtenOps(TorchDispatchMode):
    """Records the aten op packets a block dispatches (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _run(fn, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, gy: torch.Tensor):
    """(output, input grad, weight grad, bias grad or None, aten ops dispatched) of ``fn(x, w, b)``."""
    xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    bs = b.detach().clone().requires_grad_() if b is not None else None
    with _AtenOps() as ops:
        y = fn(xs, ws, bs)
        y.backward(gy)
    return y.detach(), xs.grad, ws.grad, (bs.grad if bs is not None else None), ops.names


@pytest.mark.parametrize("lead,k,n,bias", [((6,), 5, 7, True), ((2, 3), 8, 4, False), ((3, 1, 5), 16, 9, True)])
def test_onednn_linear_is_linear_computed_by_a_convolution(lead, k, n, bias) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(*lead, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    gy = torch.randn(*lead, n)
    ref = _run(F.linear, x, w, b, gy)
    got = _run(lambda xs, ws, bs: linear(xs, ws, bs, "onednn"), x, w, b, gy)
    assert got[0].shape == ref[0].shape == (*lead, n)
    for a, r in zip(got[:4], ref[:4]):
        if r is None:
            assert a is None
        else:
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)
    assert "convolution" in got[4] and "convolution_backward" in got[4]       # oneDNN served all three GEMMs
    assert not got[4] & {"mm", "addmm", "bmm", "linear"}
    assert got[0].is_contiguous()                                           # the result is a view, row-major


def test_calls_onednn_does_not_serve_stay_f_linear_bitwise() -> None:
    torch.manual_seed(1)
    x, w, b = torch.randn(4, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64), torch.randn(3,
                                                                                                    dtype=torch.float64)
    gy = torch.randn(4, 3, dtype=torch.float64)
    got = _run(lambda xs, ws, bs: linear(xs, ws, bs, "onednn"), x, w, b, gy)
    ref = _run(F.linear, x, w, b, gy)
    assert all(torch.equal(a, r) for a, r in zip(got[:4], ref[:4])) and "convolution" not in got[4]
    empty = linear(torch.randn(0, 6), torch.randn(3, 6), None, "onednn")
    assert empty.shape == (0, 3)
    columns = torch.randn(6, 3).t()                                      # [3, 6], stored column by column
    with _AtenOps() as ops:
        by_columns = linear(torch.randn(4, 6), columns, None, "onednn")
    assert by_columns.shape == (4, 3) and "convolution" not in ops.names
    x32, w32 = torch.randn(4, 6), torch.randn(3, 6)
    assert torch.equal(linear(x32, w32, None, "aten"), F.linear(x32, w32))


def test_autocast_casts_the_convolution_as_it_casts_a_linear_layer() -> None:
    torch.manual_seed(2)
    x, w, b = torch.randn(8, 32), torch.randn(16, 32), torch.randn(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, ref = linear(x, w, b, "onednn"), F.linear(x, w, b)
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


class _Net(nn.Module):
    """Two plain linear layers and a subclass of nn.Linear with its own forward."""

    class Scaled(nn.Linear):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(input)

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(6, 12)
        self.scaled = self.Scaled(12, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.scaled(torch.tanh(self.inner(x)))))


def _loss(model: nn.Module, batch: dict, state=None) -> LossOutput:
    return LossOutput(F.cross_entropy(model(batch["x"]), batch["y"]), {})


def test_the_engine_swaps_plain_linear_layers_only_and_back() -> None:
    model = _Net()
    keys, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    assert linear_sites(model) == [model.inner, model.out]
    report = use_linear_gemm(model, "onednn")
    assert report == ["linear layers: onednn GEMMs in 2 nn.Linear modules"]
    assert type(model.inner) is type(model.out) is FormulatedLinear and type(model.scaled) is _Net.Scaled
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    assert use_linear_gemm(model, "aten") == []
    assert type(model.inner) is type(model.out) is nn.Linear and "gemm" not in model.inner.__dict__
    with pytest.raises(FormulationError, match="linear_gemm='blas'"):
        use_linear_gemm(model, "blas")


def _train(strategy: Strategy, steps: int) -> tuple[list[float], list[torch.Tensor], nn.Module]:
    torch.manual_seed(7)
    model = _Net()
    batches = [{"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))} for _ in range(steps)]
    built = build_step(copy.deepcopy(model), HParams(optimizer="adam", learning_rate=0.01, max_grad_norm=1.0),
                       strategy, loss_fn=_loss)
    losses = [float(built.step([b]).loss) for b in batches]
    return losses, [p.detach().clone() for p in built.model.parameters()], built.model


@pytest.mark.parametrize("backend", ["eager", "graph"])
def test_a_built_step_with_onednn_gemms_trains_as_the_blas_step_does(backend: str) -> None:
    aten_losses, aten_params, _ = _train(Strategy(backend=backend), 4)
    losses, params, model = _train(Strategy(backend=backend, linear_gemm="onednn"), 4)
    assert type(model.inner) is FormulatedLinear
    torch.testing.assert_close(losses, aten_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(params, aten_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_strategy_takes_onednn_gemms_on_a_cpu_for_a_model_with_linear_layers() -> None:
    Strategy(linear_gemm="onednn").validate("cpu")
    validate_for_model(Strategy(linear_gemm="onednn"), _Net())
    with pytest.raises(StrategyError, match="linear_gemm=onednn needs a CPU with oneDNN"):
        Strategy(linear_gemm="onednn").validate("cuda")
    with pytest.raises(StrategyError, match=r"linear_gemm=onednn needs a CPU with oneDNN \(onednn=False turns it off\)"):
        Strategy(linear_gemm="onednn", onednn=False).validate("cpu")
    with pytest.raises(StrategyError, match="linear_gemm needs an nn.Linear or nn.MultiheadAttention"):
        validate_for_model(Strategy(linear_gemm="onednn"), nn.Sequential(nn.Conv2d(3, 3, 3)))


def test_the_option_is_offered_for_linear_layers_and_proposed_for_cpu_steps_only() -> None:
    [option] = linear_gemm_options(_Net())
    assert option.changes == {"linear_gemm": "onednn"} and "2 nn.Linear modules" in option.why
    assert linear_gemm_options(nn.Sequential(nn.Conv2d(3, 3, 3))) == []
    cpu = HardwareInfo("cpu", 2, "test cpu", (), cpu_isa=("avx2", "avx512"))
    gpu = HardwareInfo("cuda", 16, "test cpu", (), cuda_name="test gpu", cuda_capability=(9, 0))
    assert [p.changes for p in formulation_proposals([ONEDNN_LINEAR_OPTION], cpu)] == [{"linear_gemm": "onednn"}]
    assert formulation_proposals([ONEDNN_LINEAR_OPTION], gpu) == []


def _attention_inputs(batch_first: bool, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query, key, value) for self-attention, key-is-value attention or three tensors."""
    def seq(length: int) -> torch.Tensor:
        return torch.randn(3, length, 16) if batch_first else torch.randn(length, 3, 16)
    query = seq(5)
    key = query if kind == "self" else seq(7)
    return query, key, key if kind in ("self", "kv") else seq(7)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", ["self", "kv", "separate"])
@pytest.mark.parametrize("masks", ["none", "causal", "padding", "both"])
def test_formulated_attention_is_torchs_attention_with_onednn_projections(batch_first, kind, masks) -> None:
    torch.manual_seed(4)
    plain = nn.MultiheadAttention(16, 4, batch_first=batch_first)
    formulated = copy.deepcopy(plain)
    assert use_linear_gemm(formulated, "onednn") == ["linear layers: onednn GEMMs in 1 nn.MultiheadAttention module"]
    query, key, value = _attention_inputs(batch_first, kind)
    source = key.shape[1] if batch_first else key.shape[0]
    kwargs: dict = {"need_weights": False}
    if masks in ("causal", "both"):
        kwargs["attn_mask"] = (nn.Transformer.generate_square_subsequent_mask(5) if kind == "self"
                               else torch.zeros(5, source))
        kwargs["is_causal"] = kind == "self"
    if masks in ("padding", "both"):
        padding = torch.zeros(3, source)
        padding[0, -2:] = float("-inf")
        kwargs["key_padding_mask"] = padding
    ref = plain(query, key, value, **kwargs)[0]
    with _AtenOps() as ops:
        got = formulated(query, key, value, **kwargs)[0]
        got.square().sum().backward()
    ref.square().sum().backward()
    assert "convolution" in ops.names and "convolution_backward" in ops.names and not ops.names & {"mm", "addmm"}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(formulated.parameters(), plain.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def test_formulated_attention_draws_torchs_dropout_and_leaves_other_calls_to_torch() -> None:
    torch.manual_seed(5)
    plain = nn.MultiheadAttention(32, 4, dropout=0.3, batch_first=True)
    formulated = copy.deepcopy(plain)
    use_linear_gemm(formulated, "onednn")
    x = torch.randn(2, 6, 32)
    torch.manual_seed(9)
    ref = plain(x, x, x, need_weights=False)[0]
    torch.manual_seed(9)
    got = formulated(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)             # the same units dropped
    for call in (lambda m: m(x, x, x)[0], lambda m: m.eval()(x, x, x, need_weights=False)[0]):
        with torch.no_grad(), _AtenOps() as ops:                             # weights asked for; inference
            torch.manual_seed(9)
            mine = call(formulated)
        torch.manual_seed(9)
        with torch.no_grad():
            assert torch.equal(mine, call(plain)) and "convolution" not in ops.names
    use_linear_gemm(formulated, "aten")
    assert type(formulated) is nn.MultiheadAttention and "gemm" not in formulated.__dict__


@pytest.mark.parametrize("rows", [40, 1100])
def test_fused_cross_entropy_takes_its_gemms_from_onednn(rows: int) -> None:
    from hotloop.models.fused_ce import ONEDNN_CHUNK_ROWS, linear_token_loss
    torch.manual_seed(6)
    hidden, weight, bias = torch.randn(rows, 12), torch.randn(30, 12) * 0.3, torch.randn(30)
    targets = torch.randint(0, 30, (rows,))
    targets[::7] = 0                                                     # ignored rows

    def run(gemm: str):
        leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias)]
        with _AtenOps() as ops:
            loss, nll = linear_token_loss(*leaves, targets, label_smoothing=0.1, ignore_index=0, linear_gemm=gemm)
            loss.backward()
        return [loss.detach(), nll] + [t.grad for t in leaves], ops.names
    ref, ref_ops = run("aten")
    got, ops = run("onednn")
    assert "convolution" in ops and "convolution_backward" in ops and not ops & {"mm", "addmm"}
    assert "convolution" not in ref_ops
    assert rows < ONEDNN_CHUNK_ROWS or rows > ONEDNN_CHUNK_ROWS              # one chunk, or a weight gradient summed over two
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_a_models_fused_loss_reads_the_gemms_from_its_formulation() -> None:
    from hotloop.models.base import fused_token_stats
    from hotloop.models.formulation import Formulation
    torch.manual_seed(8)
    hidden, weight, targets = torch.randn(20, 8, requires_grad=True), torch.randn(30, 8), torch.randint(1, 30, (20,))
    losses = {}
    for gemm in ("aten", "onednn"):
        with _AtenOps() as ops:
            losses[gemm] = fused_token_stats(hidden, weight, None, targets, Formulation(fused_ce=True, linear_gemm=gemm),
                                             training=True, examples=4)[0]
        assert ("convolution" in ops.names) == (gemm == "onednn")
    torch.testing.assert_close(losses["onednn"], losses["aten"], rtol=1e-5, atol=1e-5)


def test_a_compiled_step_traces_the_formulated_modules_without_graph_breaks() -> None:
    import torch._dynamo as dynamo
    layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    use_linear_gemm(layers, "onednn")
    use_linear_gemm(attention, "onednn")
    q = torch.randn(2, 5, 16)
    for fn, args in ((layers, (torch.randn(5, 8),)), (lambda q: attention(q, q, q, need_weights=False)[0], (q,))):
        explained = dynamo.explain(fn)(*args)
        assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
