"""``Strategy.fused_kernel``: torch's one-kernel optimizer update on CPU, wired by the step builder."""

import inspect

import pytest
import torch

from hotloop.engine import Strategy, build_step
from hotloop.engine.build import wire_fused_optimizer
from hotloop.engine.parity import REFERENCE, check_parity, default_tolerance
from hotloop.hparams import HParams
from hotloop.optim import build_optimizer
from hotloop.testing import model_case


def _train(params, opt, steps=4):
    for step in range(steps):
        for p in params:
            p.grad = torch.cos(p.detach() * (step + 1))
        opt.step()
    return [p.detach().clone() for p in params]


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(11))]


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_wired_kernel_equals_torch_fused_optimizer_bitwise(name):
    """The wired group runs torch's fused kernel: bitwise what ``fused=True`` at construction gives."""
    hp = HParams(optimizer=name, learning_rate=0.05, weight_decay=0.01)
    params = _params()
    opt = build_optimizer(params, hp, fused=True)
    lines = wire_fused_optimizer(opt, True, kernel=True)
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["foreach"] is False
    assert any("one-kernel update" in line for line in lines)
    wired = _train(params, opt)
    ref_params = _params()
    kind = {"sgd": torch.optim.SGD, "momentum": torch.optim.SGD, "adam": torch.optim.Adam,
            "adamw": torch.optim.AdamW}[name]
    template = build_optimizer(ref_params, hp, fused=False).param_groups[0]   # the hparams' settings
    accepted = inspect.signature(kind.__init__).parameters
    settings = {k: v for k, v in template.items() if k in accepted and k not in ("params", "foreach", "fused")}
    ref = _train(ref_params, kind(ref_params, fused=True, **settings))
    assert all(torch.equal(a, b) for a, b in zip(wired, ref))


def test_kernel_is_off_by_default_and_without_fused_optimizer():
    hp = HParams(optimizer="adam", learning_rate=0.01)
    opt = build_optimizer(_params(), hp, fused=True)
    wire_fused_optimizer(opt, True)
    assert not opt.param_groups[0]["fused"] and opt.param_groups[0]["foreach"]
    wire_fused_optimizer(opt, False, kernel=True)      # the per-tensor loop wins over the kernel
    assert not opt.param_groups[0]["fused"] and not opt.param_groups[0]["foreach"]


def test_optimizer_without_a_fused_kernel_keeps_foreach():
    params = _params()
    opt = torch.optim.RMSprop(params, lr=0.1, foreach=False)       # torch has no fused RMSprop
    wire_fused_optimizer(opt, True, kernel=True)
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0].get("fused")
    _train(params, opt, steps=1)


def test_fused_kernel_step_passes_the_parity_guard_within_its_tolerance():
    """A real model (tiny transformer, Adam, clipping) under the kernel stays within the stated
    1e-4 of the per-tensor loop over 6 steps, its whole update checked in size and direction."""
    strategy = Strategy(fused_optimizer=True, fused_kernel=True)
    assert default_tolerance(strategy, "cpu") == 1e-4
    assert default_tolerance(REFERENCE.replace(fused_optimizer=True), "cpu") == 0.0
    build = model_case("transformer", "tiny", steps=6, overrides="optimizer=adam")
    result = check_parity(build, strategy, steps=6)
    assert result.ok, (result.max_abs_diff, result.update)
    assert result.update is not None and result.update.cosine > 0.99, result.update


def test_build_step_reports_the_kernel():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)

    def loss_fn(m, batch, state):
        from hotloop.models.base import LossOutput
        return LossOutput(m(batch["x"]).pow(2).mean(), {}, None)

    built = build_step(model, HParams(optimizer="adamw", learning_rate=1e-2),
                       Strategy(fused_optimizer=True, fused_kernel=True), loss_fn=loss_fn)
    assert built.optimizer.param_groups[0]["fused"] is True
    assert any("one-kernel update" in line for line in built.step.report)
    before = model.weight.detach().clone()
    built.step([{"x": torch.randn(5, 4)}])
    assert not torch.equal(before, model.weight)
