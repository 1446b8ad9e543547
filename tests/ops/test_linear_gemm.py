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
    with pytest.raises(StrategyError, match="linear_gemm needs an nn.Linear"):
        validate_for_model(Strategy(linear_gemm="onednn"), nn.Sequential(nn.Conv2d(3, 3, 3)))


def test_the_option_is_offered_for_linear_layers_and_proposed_for_cpu_steps_only() -> None:
    [option] = linear_gemm_options(_Net())
    assert option.changes == {"linear_gemm": "onednn"} and "2 nn.Linear modules" in option.why
    assert linear_gemm_options(nn.Sequential(nn.Conv2d(3, 3, 3))) == []
    cpu = HardwareInfo("cpu", 2, "test cpu", (), cpu_isa=("avx2", "avx512"))
    gpu = HardwareInfo("cuda", 16, "test cpu", (), cuda_name="test gpu", cuda_capability=(9, 0))
    assert [p.changes for p in formulation_proposals([ONEDNN_LINEAR_OPTION], cpu)] == [{"linear_gemm": "onednn"}]
    assert formulation_proposals([ONEDNN_LINEAR_OPTION], gpu) == []
