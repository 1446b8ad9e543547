"""Strategy.instance_norm: channels-last instance norms per sample, applied to any model's nn.InstanceNorm2d."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hotloop.engine.norm_formulations import (FormulatedInstanceNorm2d, instance_norm_options, instance_norm_sites,
                                              use_instance_norm)
from hotloop.engine.build import build_step
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput
from hotloop.ops.instance_norm import instance_norm2d

pytestmark = pytest.mark.usefixtures("one_thread")

#: per-sample batch norm sums in another order than aten's instance norm: fp32 results within these
FP32_TOL = dict(rtol=1e-5, atol=1e-5)


def _cl(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen, dtype=dtype) * 3 + 1   # [B, C, H, W], a non-zero mean
    return x.contiguous(memory_format=torch.channels_last)


def _run(x: torch.Tensor, gy: torch.Tensor, impl: str, then_relu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm's output and the input's gradient for upstream gradient ``gy``."""
    xs = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    y = instance_norm2d(xs, 1e-5, impl)
    if then_relu:
        y = F.relu(y, inplace=True)       # as CycleGAN's blocks do after the norm
    y.backward(gy)
    assert torch.equal(xs.detach(), x)    # the norm's input is untouched (its output is written in place)
    return y.detach(), xs.grad


@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 16, 8, 8), (1, 3, 4, 4), (1, 8, 6, 5)])
@pytest.mark.parametrize("then_relu", [False, True])
@pytest.mark.parametrize("impl", ["per_sample", "aten"])
def test_channels_last_maps_match_aten_on_contiguous_ones(shape, then_relu, impl) -> None:
    """The reference is aten's instance norm of NCHW copies: at batch one (where torch's own
    channels-last backward is wrong) both values must still agree with it."""
    x, gy = _cl(*shape), _cl(*shape, seed=1)
    want = _run(x.contiguous(), gy.contiguous(), "aten", then_relu)
    got = _run(x, gy, impl, then_relu)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32_TOL)
    if impl == "per_sample" or shape[0] == 1:
        assert all(t.is_contiguous(memory_format=torch.channels_last) for t in got)   # no copy to NCHW and back


def test_per_sample_gradient_is_exact_in_float64() -> None:
    x = _cl(2, 3, 4, 5, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: instance_norm2d(t, 1e-5, "per_sample"), (x,))
    assert instance_norm2d(x, 1e-5, "per_sample").grad_fn.name().startswith("_PerSampleNorm")


def _plain(x: torch.Tensor, gy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xs = x.detach().clone().requires_grad_()
    y = F.instance_norm(xs)
    y.backward(gy)
    return y.detach(), xs.grad


@pytest.mark.parametrize("batch", [1, 2])
def test_contiguous_maps_are_aten_bitwise(batch) -> None:
    x, gy = _cl(batch, 4, 6, 6).contiguous(), torch.randn(batch, 4, 6, 6)   # NCHW: aten is the faster there
    for impl in ("aten", "per_sample"):
        for got, want in zip(_run(x, gy, impl), _plain(x, gy)):
            assert torch.equal(got, want)


def test_other_inputs_take_aten_unchanged() -> None:
    x = _cl(2, 4, 6, 6).contiguous()
    norm = nn.InstanceNorm2d(4)
    unbatched = torch.randn(4, 6, 6)
    use_instance_norm(nn.Sequential(norm), "per_sample")
    assert type(norm) is FormulatedInstanceNorm2d and torch.equal(norm(unbatched), F.instance_norm(unbatched[None])[0])
    with pytest.raises(ValueError, match=r"instance_norm='fast'; choose one of \['aten', 'per_sample'\]"):
        instance_norm2d(x, 1e-5, "fast")


def test_under_bf16_autocast_it_keeps_aten_dtype_and_bf16_rounding() -> None:
    conv = nn.Conv2d(3, 8, 3, padding=1).to(memory_format=torch.channels_last)
    x = _cl(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = conv(x)                                                    # bf16 [2, 8, 8, 8]
        aten, per_sample = instance_norm2d(h, 1e-5, "aten"), instance_norm2d(h, 1e-5, "per_sample")
    assert per_sample.dtype == aten.dtype
    torch.testing.assert_close(per_sample.float(), aten.float(), rtol=2e-2, atol=2e-2)


class Styled(nn.Module):
    """Convs with a plain, an affine and a running-statistics instance norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.mix = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
        self.plain, self.affine = nn.InstanceNorm2d(6), nn.InstanceNorm2d(6, affine=True)
        self.running = nn.InstanceNorm2d(6, track_running_stats=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv(x)                                                       # [B, 6, H, W]
        h = self.mix(c + F.relu(self.plain(c), inplace=True))                 # a residual block around the norm
        return self.head(F.relu(self.running(self.affine(h))).mean((2, 3)))   # a normalised map's mean is 0


def test_engine_turns_only_plain_instance_norms_and_back() -> None:
    model = Styled()
    keys, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    assert instance_norm_sites(model) == [model.plain]
    assert use_instance_norm(model, "per_sample") == ["instance norm: per_sample in 1 nn.InstanceNorm2d module"]
    assert type(model.plain) is FormulatedInstanceNorm2d and model.plain.impl == "per_sample"
    assert type(model.affine) is type(model.running) is nn.InstanceNorm2d
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    assert type(copy.deepcopy(model).plain) is FormulatedInstanceNorm2d
    with pytest.raises(ValueError, match="expected 6 channels"):
        model.plain(torch.randn(2, 5, 4, 4))
    assert use_instance_norm(model, "aten", channels_last=True) == [
        "instance norm: aten in 1 nn.InstanceNorm2d module, batches of one as batch norm (channels-last gradients)"]
    assert type(model.plain) is FormulatedInstanceNorm2d and model.plain.impl == "aten"
    assert use_instance_norm(model) == [] and type(model.plain) is nn.InstanceNorm2d
    assert "impl" not in vars(model.plain)
    assert [o.changes for o in instance_norm_options(model)] == [{"instance_norm": "per_sample"}]
    assert instance_norm_options(model)[0].timed_with == {"channels_last": True}
    assert instance_norm_options(nn.Sequential(nn.Conv2d(3, 3, 3))) == []


def test_strategy_refuses_the_field_for_a_model_without_plain_instance_norms() -> None:
    validate_for_model(Strategy(instance_norm="per_sample"), Styled())
    with pytest.raises(StrategyError, match="instance_norm needs an nn.InstanceNorm2d without affine"):
        validate_for_model(Strategy(instance_norm="per_sample"), nn.Sequential(nn.Conv2d(3, 3, 3)))
    with pytest.raises(StrategyError, match=r"instance_norm='fast'; choose one of \['aten', 'per_sample'\]"):
        Strategy(instance_norm="fast").validate("cpu")


def _loss(model: nn.Module, batch: dict, state: object) -> LossOutput:
    return LossOutput(F.cross_entropy(model(batch["x"]), batch["y"]), {})


def _train(strategy: Strategy, batch_size: int) -> tuple[list[float], list[torch.Tensor], list[str]]:
    """Three SGD steps of ``build_step``'s step: the losses, the final parameters, the report."""
    torch.manual_seed(4)
    model = Styled()
    batches = [{"x": torch.randn(batch_size, 3, 8, 8), "y": torch.randint(0, 2, (batch_size,))} for _ in range(3)]
    built = build_step(model, HParams(optimizer="sgd", learning_rate=0.5, max_grad_norm=0.0), strategy, loss_fn=_loss)
    losses = [float(built.step([b]).loss) for b in batches]
    return losses, [p.detach().clone() for p in model.parameters()], list(built.step.report)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("impl", ["aten", "per_sample"])
def test_built_channels_last_steps_train_like_the_plain_contiguous_step(batch_size, impl) -> None:
    losses, params, _ = _train(Strategy(), batch_size)
    got_losses, got_params, report = _train(Strategy(channels_last=True, instance_norm=impl), batch_size)
    torch.testing.assert_close(got_losses, losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(got_params, params):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert any(line.startswith(f"instance norm: {impl} in 1 nn.InstanceNorm2d module") for line in report), report


@pytest.mark.parametrize("batch_size", [1, 3])
def test_the_captured_graph_backend_runs_the_formulation_as_eager_does(batch_size) -> None:
    eager = _train(Strategy(channels_last=True, instance_norm="per_sample"), batch_size)
    graph = _train(Strategy(channels_last=True, instance_norm="per_sample", backend="graph"), batch_size)
    assert any(line.startswith("captured graph #1") for line in graph[2]), graph[2]
    torch.testing.assert_close(graph[0], eager[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_channels_last_cyclegan_gets_the_gradients_of_the_contiguous_model(batch_size) -> None:
    """Float64, one generator and one discriminator backward: the gradients of the formulated
    channels-last model are those of the plain contiguous one (at batch one, aten's own
    channels-last backward is off by order one here). A CycleGAN under Adam is too chaotic for
    the parity guard's three-step fp32 comparison: its relayout alone fails it (cosine 0.91)."""
    from hotloop.models.cyclegan import CycleGAN, CycleGANHParams
    from hotloop.problems.base import ProblemSpec
    hp = CycleGANHParams(image_size=16, gen_filters=4, gen_blocks=1, disc_filters=4, disc_layers=2,
                          batch_size=batch_size)
    torch.manual_seed(0)
    model = CycleGAN(hp, ProblemSpec(task="image2image", input_vocab_size=0, target_vocab_size=3, pad_id=-1))
    model = model.double()
    batch = {k: torch.rand(batch_size, 3, 16, 16, dtype=torch.float64) * 2 - 1 for k in ("inputs", "targets")}

    def grads(impl: str | None) -> dict[str, torch.Tensor]:
        m, b = copy.deepcopy(model), dict(batch)
        if impl is not None:
            use_instance_norm(m, impl, channels_last=True)
            m = m.to(memory_format=torch.channels_last)
            b = {k: v.contiguous(memory_format=torch.channels_last) for k, v in b.items()}
        torch.manual_seed(1)
        m.generator_loss(b).loss.backward()
        m.discriminator_loss(b).loss.backward()
        return {n: p.grad for n, p in m.named_parameters()}

    want = grads(None)
    for impl in ("aten", "per_sample"):
        got = grads(impl)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-10, msg=f"{impl}: {name}")


def test_the_tuner_times_the_option_for_cyclegan_in_channels_last() -> None:
    from hotloop.compose.build import build_run
    from hotloop.tools.formulation_candidates import formulation_options
    from hotloop.tools.hardware import HardwareInfo
    from hotloop.tools.proposals import formulation_proposals
    gan = build_run("shapes_unpaired", "cyclegan", "cyclegan_small",
                    "image_size=32,gen_filters=4,disc_filters=4,gen_blocks=1,batch_size=2").model
    options = [o for o in formulation_options(gan) if "instance_norm" in o.changes]
    assert [o.why.endswith(f"({len(instance_norm_sites(gan))} nn.InstanceNorm2d modules)") for o in options] == [True]
    [proposal] = formulation_proposals(options, HardwareInfo("cpu", 2, "zen 3", (), cpu_isa=("avx2",)))
    assert proposal.changes == {"channels_last": True, "instance_norm": "per_sample"}
