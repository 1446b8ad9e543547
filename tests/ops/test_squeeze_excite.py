"""Strategy.se_backward: the squeeze-excitation gate's linked backward gives autograd's numbers bitwise."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hotloop.compose.build import build_run
from hotloop.engine.build import build_step
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.models.resnet import SqueezeExcitation
from hotloop.ops.squeeze_excite import squeeze_excite


def _gate_grads(se_backward: str, layout: torch.memory_format, dtype: torch.dtype = torch.float32,
                autocast: bool = False) -> list[torch.Tensor]:
    torch.manual_seed(0)
    gate = SqueezeExcitation(16, 4)
    gate.se_backward = se_backward
    x = torch.randn(3, 16, 5, 7).contiguous(memory_format=layout).requires_grad_()
    upstream = torch.randn(3, 16, 5, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = gate(x.to(dtype) if dtype != torch.float32 else x)
    y.backward(upstream.to(y.dtype))
    return [y.detach(), x.grad] + [p.grad for p in gate.parameters()]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_fused_backward_is_bitwise_autograds_in_fp32(layout) -> None:
    plain, fused = _gate_grads("aten", layout), _gate_grads("fused", layout)
    assert len(plain) == 6
    for a, b in zip(plain, fused):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_fused_backward_is_bitwise_autograds_under_bf16_autocast() -> None:
    plain = _gate_grads("aten", torch.channels_last, torch.bfloat16, autocast=True)
    fused = _gate_grads("fused", torch.channels_last, torch.bfloat16, autocast=True)
    assert plain[0].dtype == torch.bfloat16
    for a, b in zip(plain, fused):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_the_input_gradient_alone_and_a_second_backward_are_exact() -> None:
    torch.manual_seed(1)
    reduce, expand = nn.Conv2d(8, 2, 1), nn.Conv2d(2, 8, 1)
    x = torch.randn(2, 8, 4, 4, requires_grad=True)
    upstream = torch.randn(2, 8, 4, 4)
    want = torch.autograd.grad(squeeze_excite(x, reduce, expand, "aten"), x, upstream)[0]
    y = squeeze_excite(x, reduce, expand, "fused")
    first = torch.autograd.grad(y, x, upstream, retain_graph=True)[0]
    second = torch.autograd.grad(y, x, upstream)[0]
    assert torch.equal(first, want) and torch.equal(second, want)


def test_without_gradients_the_forward_is_the_plain_one_and_bad_values_are_refused() -> None:
    reduce, expand = nn.Conv2d(8, 2, 1), nn.Conv2d(2, 8, 1)
    x = torch.randn(2, 8, 4, 4)
    with torch.no_grad():
        assert torch.equal(squeeze_excite(x, reduce, expand, "fused"), squeeze_excite(x, reduce, expand, "aten"))
    with pytest.raises(ValueError, match="se_backward='taps'; choose one of"):
        squeeze_excite(x, reduce, expand, "taps")


def test_se_resnext_steps_bitwise_with_the_fused_backward_and_the_tuner_is_offered_it() -> None:
    run = build_run("image_mnist", "se_resnext50", "se_resnext_small",
                    "batch_size=8,stage_blocks=1:1,stem_channels=8,stage_channels=16,cardinality=2")
    batches = [next(iter(run.problem.reader("train", run.hp))) for _ in range(2)]
    results = []
    for se_backward in ("aten", "fused"):
        strategy = Strategy(se_backward=se_backward, channels_last=True).validate(torch.device("cpu"))
        built = build_step(copy.deepcopy(run.model).train(), run.hp, strategy)
        gates = [m for m in built.model.modules() if isinstance(m, SqueezeExcitation)]
        assert gates and all(g.se_backward == se_backward for g in gates)     # the strategy reached them
        losses = [float(built.step([b]).loss) for b in batches + batches]
        results.append((losses, [p.detach().clone() for p in built.model.parameters()]))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    assert [o.label for o in run.model.formulation_options()] == ["se_backward=fused"]
    validate_for_model(Strategy(se_backward="fused"), run.model)


def test_a_model_without_gates_refuses_the_field() -> None:
    run = build_run("image_mnist", "conv_net", "conv_net_base", "batch_size=4")
    with pytest.raises(StrategyError, match="se_backward"):
        validate_for_model(Strategy(se_backward="fused"), run.model)
