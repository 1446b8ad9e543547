"""Strategy.batch_norm: channels-last batch norms with two-pass statistics, applied to any
model's nn.BatchNorm2d."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hotloop.engine.build import build_step
from hotloop.engine.norm_formulations import (FormulatedBatchNorm2d, batch_norm_options, batch_norm_sites,
                                              use_batch_norm)
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput
from hotloop.ops.batch_norm import batch_norm2d

pytestmark = pytest.mark.usefixtures("one_thread")

#: two-pass statistics sum in another order than aten's contiguous kernel: fp32 results within these
FP32_TOL = dict(rtol=1e-5, atol=1e-5)


def _cl(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32, offset: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen, dtype=dtype) * 3 + offset    # [N, C, H, W], a non-zero mean
    return x.contiguous(memory_format=torch.channels_last)


def _run(x: torch.Tensor, gy: torch.Tensor, impl: str, affine: bool = True) -> tuple[torch.Tensor, ...]:
    """The output and the gradients of the input, weight and bias for upstream gradient ``gy``."""
    xs = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    gen = torch.Generator().manual_seed(7)
    c = x.shape[1]
    w = (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).to(x.dtype).requires_grad_() if affine else None
    b = torch.randn(c, generator=gen, dtype=torch.float64).to(x.dtype).requires_grad_() if affine else None
    y = batch_norm2d(xs, None, None, w, b, True, 0.1, 1e-5, impl)
    F.relu(y, inplace=True).backward(gy)      # an in-place op after the norm, as the conv nets have
    assert torch.equal(xs.detach(), x)        # the input is untouched
    return (y.detach(), xs.grad) + ((w.grad, b.grad) if affine else ())


@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (4, 16, 8, 8), (1, 3, 4, 4), (8, 2, 1, 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_channels_last_maps_match_aten_on_contiguous_ones(shape, affine) -> None:
    x, gy = _cl(*shape), _cl(*shape, seed=1)
    want = _run(x.contiguous(), gy.contiguous(), "aten", affine)
    got = _run(x, gy, "two_pass", affine)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32_TOL)
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in got[:2])   # no copy to NCHW


def test_gradient_is_exact_in_float64() -> None:
    x = _cl(3, 4, 5, 6, dtype=torch.float64).requires_grad_()
    w = torch.rand(4, dtype=torch.float64).add_(0.5).requires_grad_()
    b = torch.randn(4, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: batch_norm2d(*t[:1], None, None, *t[1:], True, 0.1, 1e-5, "two_pass"),
                                    (x, w, b))
    assert batch_norm2d(x, None, None, w, b, True, 0.1, 1e-5, "two_pass").grad_fn.name().startswith("_TwoPass")


def _rel_errors(impl: str, contiguous: bool) -> list[float]:
    """Relative errors of the output and the three gradients against float64, on a map whose
    channels' means are large against their spread (where one-pass sums lose digits)."""
    x64, gy64 = _cl(16, 8, 32, 32, dtype=torch.float64, offset=20.0), _cl(16, 8, 32, 32, seed=1, dtype=torch.float64)
    want = _run(x64, gy64, "aten")
    x, gy = x64.float(), gy64.float()
    got = _run(x.contiguous(), gy.contiguous(), impl) if contiguous else _run(x, gy, impl)
    return [float((g.double() - w).norm() / w.norm()) for g, w in zip(got, want)]


def test_two_pass_is_as_accurate_as_the_contiguous_kernel() -> None:
    """Against float64, the channels-last two-pass norm errs no more than 3x aten's contiguous
    (NCHW) kernel, output and gradients alike."""
    nchw, two_pass = _rel_errors("aten", contiguous=True), _rel_errors("two_pass", contiguous=False)
    for name, got, floor in zip(("output", "input grad", "weight grad", "bias grad"), two_pass, nchw):
        assert got <= 3 * max(floor, 1e-8), f"{name}: {got:.1e} vs the contiguous kernel's {floor:.1e}"


def _module_pair(**kwargs) -> tuple[nn.BatchNorm2d, nn.BatchNorm2d]:
    plain = nn.BatchNorm2d(6, **kwargs)
    formulated = copy.deepcopy(plain)
    assert use_batch_norm(nn.Sequential(formulated), "two_pass") == ["batch norm: two_pass in 1 nn.BatchNorm2d module"]
    return plain, formulated


@pytest.mark.parametrize("kwargs", [{}, {"momentum": None}, {"track_running_stats": False}, {"affine": False}])
def test_module_keeps_nn_batchnorm2d_state_and_eval_behaviour(kwargs) -> None:
    plain, formulated = _module_pair(**kwargs)
    assert type(formulated) is FormulatedBatchNorm2d
    for seed in range(3):
        x = _cl(8, 6, 5, 7, seed=seed)
        torch.testing.assert_close(formulated(x), plain(x), **FP32_TOL)
    for name, buffer in plain.named_buffers():
        torch.testing.assert_close(dict(formulated.named_buffers())[name], buffer, rtol=1e-6, atol=1e-7)
    formulated.load_state_dict(plain.state_dict())
    plain.eval(), formulated.eval()
    x = _cl(2, 6, 5, 7, seed=9)
    if plain.track_running_stats:
        assert torch.equal(formulated(x), plain(x))           # eval mode is aten's kernel, bitwise
    else:                                                     # without running statistics: batch statistics
        torch.testing.assert_close(formulated(x), plain(x), **FP32_TOL)
    formulated.train(), plain.train()
    assert torch.equal(formulated(x.contiguous()), plain(x.contiguous()))   # so is a contiguous map


def test_unknown_value_and_shape_errors_name_the_cause() -> None:
    with pytest.raises(ValueError, match=r"batch_norm='fast'; choose one of \['aten', 'two_pass'\]"):
        batch_norm2d(_cl(2, 3, 4, 4), None, None, None, None, True, 0.1, 1e-5, "fast")
    with pytest.raises(StrategyError, match=r"batch_norm='fast'; choose one of \['aten', 'two_pass'\]"):
        Strategy(batch_norm="fast").validate("cpu")
    _, formulated = _module_pair()
    with pytest.raises(ValueError, match="expected 4D input"):
        formulated(torch.zeros(2, 6))


class ConvBN(nn.Module):
    """A conv net with a plain and a subclassed batch norm (the engine turns only the plain one)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.plain = nn.BatchNorm2d(8)
        self.special = type("MyNorm", (nn.BatchNorm2d,), {})(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.special(self.plain(self.conv(x))))         # [B, 8, H, W]
        return self.head(h.mean((2, 3)))


def test_engine_turns_only_plain_batch_norms_and_back() -> None:
    model = ConvBN()
    assert batch_norm_sites(model) == [model.plain]
    use_batch_norm(model, "two_pass")
    assert type(model.plain) is FormulatedBatchNorm2d and type(model.special).__name__ == "MyNorm"
    assert use_batch_norm(model) == [] and type(model.plain) is nn.BatchNorm2d
    assert [o.changes for o in batch_norm_options(model)] == [{"batch_norm": "two_pass"}]
    assert batch_norm_options(model)[0].timed_with == {"channels_last": True}
    assert batch_norm_options(nn.Sequential(nn.Conv2d(3, 3, 3))) == []
    validate_for_model(Strategy(batch_norm="two_pass"), model)
    with pytest.raises(StrategyError, match="batch_norm needs an nn.BatchNorm2d"):
        validate_for_model(Strategy(batch_norm="two_pass"), nn.Sequential(nn.Conv2d(3, 3, 3)))


def _loss(model: nn.Module, batch: dict, state: object) -> LossOutput:
    return LossOutput(F.cross_entropy(model(batch["x"]), batch["y"]), {})


def _train(strategy: Strategy) -> tuple[list[float], list[torch.Tensor], list[str]]:
    """Three SGD steps of ``build_step``'s step: the losses, the final parameters and buffers, the report."""
    torch.manual_seed(4)
    model = ConvBN()
    batches = [{"x": torch.randn(4, 3, 8, 8) + 2, "y": torch.randint(0, 2, (4,))} for _ in range(3)]
    built = build_step(model, HParams(optimizer="sgd", learning_rate=0.5, max_grad_norm=0.0), strategy, loss_fn=_loss)
    losses = [float(built.step([b]).loss) for b in batches]
    state = [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]
    return losses, state, list(built.step.report)


def test_built_channels_last_step_trains_like_the_plain_contiguous_step() -> None:
    losses, state, _ = _train(Strategy())
    got_losses, got_state, report = _train(Strategy(channels_last=True, batch_norm="two_pass"))
    torch.testing.assert_close(got_losses, losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(got_state, state):
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-6)
    assert any(line.startswith("batch norm: two_pass in 1 nn.BatchNorm2d module") for line in report), report


def test_the_captured_graph_backend_runs_the_formulation_as_eager_does() -> None:
    eager = _train(Strategy(channels_last=True, batch_norm="two_pass"))
    graph = _train(Strategy(channels_last=True, batch_norm="two_pass", backend="graph"))
    assert any(line.startswith("captured graph #1") for line in graph[2]), graph[2]
    torch.testing.assert_close(graph[0], eager[0], rtol=1e-6, atol=1e-7)
