"""Strategy.dilated_conv_wgrad and pointwise_conv: aten's convolutions computed otherwise, applied to any model."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hotloop.engine.build import build_step
from hotloop.engine.conv_formulations import FormulatedConv2d, conv_formulation_options, use_conv_formulations
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput
from hotloop.models.formulation import FormulationError
from hotloop.ops.dilated_conv import dilated_conv2d, valid_fraction
from hotloop.ops.pointwise_conv import POINTWISE_GEMM_MAX_MACS, pointwise_conv2d

pytestmark = pytest.mark.usefixtures("one_thread")

#: (N, C, H, W, O, dilation, padding, bias, channels_last): small maps where the taps path runs
CASES = [(2, 6, 8, 8, 5, 4, 4, False, False), (2, 6, 8, 8, 5, 6, 6, True, True),
         (3, 4, 7, 9, 3, 5, 5, True, False), (2, 5, 6, 6, 4, 3, 2, False, True)]


def _grads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, gy: torch.Tensor, fn) -> list[torch.Tensor]:
    xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    bs = b.detach().clone().requires_grad_() if b is not None else None
    y = fn(xs, ws, bs)
    y.backward(gy)
    return [y.detach(), xs.grad, ws.grad] + ([bs.grad] if bs is not None else [])


@pytest.mark.parametrize("n,c,h,w,o,d,p,bias,cl", CASES)
def test_taps_weight_gradient_matches_aten_and_the_rest_is_bitwise(n, c, h, w, o, d, p, bias, cl) -> None:
    torch.manual_seed(0)
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = torch.randn(n, c, h, w).contiguous(memory_format=fmt)
    weight = torch.randn(o, c, 3, 3).contiguous(memory_format=fmt)
    b = torch.randn(o) if bias else None
    assert valid_fraction((h, w), (3, 3), (d, d), (p, p)) <= 0.5          # the case takes the taps path
    out_shape = F.conv2d(x, weight, b, 1, p, d).shape
    gy = torch.randn(out_shape)
    ref = _grads(x, weight, b, gy, lambda xs, ws, bs: F.conv2d(xs, ws, bs, 1, p, d))
    taps = _grads(x, weight, b, gy, lambda xs, ws, bs: dilated_conv2d(xs, ws, bs, (1, 1), (p, p), (d, d), 1, "taps"))
    assert torch.equal(taps[0], ref[0])                                     # forward: aten's
    assert torch.equal(taps[1], ref[1])                                     # input gradient: aten's
    torch.testing.assert_close(taps[2], ref[2], rtol=1e-5, atol=1e-5)       # weight gradient: reordered sum
    assert taps[2].stride() == ref[2].stride()                              # laid out like the weight
    if bias:
        torch.testing.assert_close(taps[3], ref[3], rtol=1e-6, atol=1e-6)


def test_valid_fraction_counts_taps_inside_the_map() -> None:
    assert valid_fraction((8, 8), (3, 3), (1, 1), (1, 1)) == pytest.approx((22 / 24) ** 2)
    assert valid_fraction((8, 8), (3, 3), (6, 6), (6, 6)) == pytest.approx((12 / 24) ** 2)
    assert valid_fraction((8, 8), (3, 3), (8, 8), (8, 8)) == pytest.approx((8 / 24) ** 2)   # outer taps: padding only


def test_large_maps_and_other_convolutions_stay_plain_conv2d() -> None:
    torch.manual_seed(1)
    x, w = torch.randn(1, 3, 32, 32, requires_grad=True), torch.randn(4, 3, 3, 3, requires_grad=True)
    for args in (((1, 1), (2, 2), (2, 2), 1), ((2, 2), (4, 4), (4, 4), 1)):
        y = dilated_conv2d(x, w, None, *args, "taps")
        assert y.grad_fn.name() == "ConvolutionBackward0"                  # aten's, not the taps function
    small = torch.randn(1, 3, 8, 8)
    assert dilated_conv2d(small, w, None, (1, 1), (6, 6), (6, 6), 1, "aten").grad_fn.name() == "ConvolutionBackward0"
    assert dilated_conv2d(small, w, None, (1, 1), (6, 6), (6, 6), 1, "taps").grad_fn.name() != "ConvolutionBackward0"


def test_bf16_autocast_casts_like_a_convolution() -> None:
    torch.manual_seed(2)
    x, w = torch.randn(2, 4, 8, 8), torch.randn(3, 4, 3, 3)
    gy = torch.randn(2, 3, 8, 8)
    grads = {}
    for wgrad in ("aten", "taps"):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = dilated_conv2d(xs, ws, None, (1, 1), (5, 5), (5, 5), 1, wgrad)
        assert y.dtype == torch.bfloat16
        y.backward(gy.to(y.dtype))
        grads[wgrad] = (y.float(), xs.grad, ws.grad)
    assert grads["taps"][1].dtype == grads["taps"][2].dtype == torch.float32
    assert torch.equal(grads["taps"][0], grads["aten"][0])
    for a, b in zip(grads["taps"][1:], grads["aten"][1:]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_pointwise_gemm_matches_the_convolution(channels_last: bool, bias: bool) -> None:
    torch.manual_seed(4)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(3, 6, 5, 4).contiguous(memory_format=fmt)
    weight = torch.randn(7, 6, 1, 1).contiguous(memory_format=fmt)
    b = torch.randn(7) if bias else None
    gy = torch.randn(3, 7, 5, 4)
    ref = _grads(x, weight, b, gy, lambda xs, ws, bs: F.conv2d(xs, ws, bs))
    gemm = _grads(x, weight, b, gy, lambda xs, ws, bs: pointwise_conv2d(xs, ws, bs, "gemm"))
    for a, r in zip(gemm, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_pointwise_gemm_runs_only_on_small_maps_and_dense_layouts() -> None:
    w = torch.randn(4, 3, 1, 1, requires_grad=True)
    small = pointwise_conv2d(torch.randn(2, 3, 8, 8), w, None, "gemm")
    assert small.grad_fn.name() != "ConvolutionBackward0"
    side = int((POINTWISE_GEMM_MAX_MACS // 2) ** 0.5) + 1
    assert pointwise_conv2d(torch.randn(2, 3, side, side), w, None, "gemm").grad_fn.name() == "ConvolutionBackward0"
    strided = torch.randn(2, 3, 8, 16)[..., ::2]
    assert pointwise_conv2d(strided, w, None, "gemm").grad_fn.name() == "ConvolutionBackward0"
    assert pointwise_conv2d(torch.randn(2, 3, 8, 8), w, None, "aten").grad_fn.name() == "ConvolutionBackward0"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert pointwise_conv2d(torch.randn(2, 3, 8, 8), w, None, "gemm").dtype == torch.bfloat16


class Atrous(nn.Module):
    """A user's model: a dilated conv and a 1x1 conv (the sites), a strided dilated conv, a padded
    1x1 conv and a plain 3x3 conv (not sites)."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Conv2d(3, 6, 3, padding=1)
        self.atrous = nn.Conv2d(6, 6, 3, padding=6, dilation=6)
        self.pointwise = nn.Conv2d(6, 6, 1)
        self.padded = nn.Conv2d(6, 6, 1, padding=1)
        self.strided = nn.Conv2d(6, 4, 3, stride=2, padding=2, dilation=2)
        self.head = nn.Linear(4 * 25, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # [B, 3, 8, 8] -> [B, 2]
        h = torch.relu(self.atrous(torch.relu(self.plain(x))))
        h = self.padded(torch.relu(self.pointwise(h)))          # [B, 6, 10, 10]
        return self.head(self.strided(h).flatten(1))


def _loss(model: nn.Module, batch, state) -> LossOutput:
    return LossOutput(F.cross_entropy(model(batch["x"]), batch["y"]), {})


def test_engine_turns_only_the_eligible_convs_and_back() -> None:
    model = Atrous()
    keys = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    assert use_conv_formulations(model, "taps") == ["dilated conv weight gradient: taps in 1 nn.Conv2d module"]
    assert type(model.atrous) is FormulatedConv2d and model.atrous.wgrad == "taps"
    assert all(type(m) is nn.Conv2d for m in (model.plain, model.pointwise, model.padded, model.strided))
    assert use_conv_formulations(model, "taps", "gemm")[1] == "1x1 convs: gemm in 1 nn.Conv2d module"
    assert type(model.pointwise) is FormulatedConv2d and model.pointwise.pointwise == "gemm"
    assert type(model.padded) is nn.Conv2d
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    assert type(copy.deepcopy(model).atrous) is FormulatedConv2d
    assert use_conv_formulations(model) == [] and type(model.atrous) is type(model.pointwise) is nn.Conv2d
    with pytest.raises(FormulationError, match="choose one of"):
        use_conv_formulations(model, "fast")
    with pytest.raises(FormulationError, match="choose one of"):
        use_conv_formulations(model, "aten", "fast")
    assert [o.changes for o in conv_formulation_options(model)] == [{"dilated_conv_wgrad": "taps"},
                                                                    {"pointwise_conv": "gemm"}]
    assert conv_formulation_options(nn.Sequential(nn.Conv2d(3, 3, 3, padding=1))) == []


def test_strategy_refuses_the_fields_for_a_model_without_such_convs() -> None:
    validate_for_model(Strategy(dilated_conv_wgrad="taps", pointwise_conv="gemm"), Atrous())
    with pytest.raises(StrategyError, match="dilated_conv_wgrad needs a dilated nn.Conv2d"):
        validate_for_model(Strategy(dilated_conv_wgrad="taps"), nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(StrategyError, match="pointwise_conv needs an unpadded 1x1 nn.Conv2d"):
        validate_for_model(Strategy(pointwise_conv="gemm"), nn.Sequential(nn.Conv2d(3, 3, 3)))


def _train(model: nn.Module, strategy: Strategy, steps: int, seed: int) -> tuple[list[float], list[torch.Tensor]]:
    """``steps`` SGD steps of ``build_step``'s step on a copy of ``model``: the losses and the final parameters."""
    torch.manual_seed(seed)
    batches = [{"x": torch.randn(4, 3, 8, 8), "y": torch.randint(0, 2, (4,))} for _ in range(steps)]
    m = copy.deepcopy(model)
    built = build_step(m, HParams(optimizer="sgd", learning_rate=0.1, max_grad_norm=0.0), strategy, loss_fn=_loss)
    forms = (strategy.dilated_conv_wgrad, strategy.pointwise_conv) != ("aten", "aten")
    assert (type(m.atrous) is type(m.pointwise) is FormulatedConv2d) == forms
    return [float(built.step([b]).loss) for b in batches], [p.detach().clone() for p in m.parameters()]


FORMULATED = Strategy(dilated_conv_wgrad="taps", pointwise_conv="gemm")


@pytest.mark.parametrize("channels_last", [False, True])
def test_built_steps_train_alike_with_either_formulation(channels_last: bool) -> None:
    torch.manual_seed(3)
    model = Atrous()
    aten = _train(model, Strategy(channels_last=channels_last), 3, seed=3)
    taps = _train(model, FORMULATED.replace(channels_last=channels_last), 3, seed=3)
    torch.testing.assert_close(taps[0], aten[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(taps[1], aten[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_captured_graph_backend_runs_the_formulations_as_eager_does() -> None:
    torch.manual_seed(5)
    model = Atrous()
    eager = _train(model, FORMULATED, 2, seed=5)[0]
    graph = _train(model, FORMULATED.replace(backend="graph"), 2, seed=5)[0]
    torch.testing.assert_close(graph, eager, rtol=1e-6, atol=1e-7)
