"""Clipping folded into the SGD step (clip_via_lr): same update up to rounding, clear refusals."""
from __future__ import annotations

import pytest
import torch

from hotloop.engine.clipping import clip_grad_norm, clip_via_lr, clip_via_lr_unavailable
from hotloop.engine.build import build_step
from hotloop.engine.strategy import Strategy
from hotloop.hparams import HParams


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 40), torch.nn.Tanh(), torch.nn.Linear(40, 5))


def _grads(model: torch.nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    (model(x) ** 2).mean().backward()


@pytest.mark.parametrize("foreach", [False, True])
def test_fold_matches_clip_then_sgd_within_rounding_and_is_bitwise_when_not_clipping(foreach: bool) -> None:
    x = torch.randn(16, 20, generator=torch.Generator().manual_seed(1))
    for max_norm, bitwise in ((0.05, False), (1e3, True)):
        ref, folded = _model(), _model()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, foreach=foreach)
        opt = torch.optim.SGD(folded.parameters(), lr=0.5, foreach=foreach)
        for _ in range(4):
            _grads(ref, x)
            _grads(folded, x)
            ref_norm = clip_grad_norm(list(ref.parameters()), max_norm)
            ref_opt.step()
            norm = clip_via_lr(opt, list(folded.parameters()), max_norm)
            assert torch.equal(norm, ref_norm)                         # same pre-clip norm
            assert opt.param_groups[0]["lr"] == 0.5                    # lr restored after the step
        for a, b in zip(ref.parameters(), folded.parameters()):
            if bitwise:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
        moved = any(not torch.equal(a, b) for a, b in zip(_model().parameters(), folded.parameters()))
        assert moved


def test_only_plain_sgd_can_fold_and_cuda_gradients_do_not() -> None:
    params = list(_model().parameters())
    cpu = torch.device("cpu")
    assert clip_via_lr_unavailable(torch.optim.SGD(params, lr=0.1), cpu) is None
    assert "sync the host" in clip_via_lr_unavailable(torch.optim.SGD(params, lr=0.1), torch.device("cuda"))
    assert clip_via_lr_unavailable(torch.optim.Adam(params), cpu) == "the optimizer is Adam, not plain SGD"
    assert "momentum=0.9" in clip_via_lr_unavailable(torch.optim.SGD(params, lr=0.1, momentum=0.9), cpu)
    assert "weight_decay" in clip_via_lr_unavailable(torch.optim.SGD(params, lr=0.1, weight_decay=1e-4), cpu)


class _Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def loss(self, batch, state=None):
        from hotloop.models.base import LossOutput
        loss = ((self.net(batch["inputs"]) - batch["targets"]) ** 2).mean()
        return LossOutput(loss, {"loss_sum": loss.detach()}, state)


def test_build_step_folds_the_clip_for_sgd_and_clips_gradients_for_adam() -> None:
    batch = {"inputs": torch.randn(8, 20), "targets": 10 * torch.randn(8, 5)}
    hp = HParams(optimizer="sgd", learning_rate=0.05, max_grad_norm=0.5, weight_decay=0.0)
    ref, folded = _Regressor(), _Regressor()
    ref_step = build_step(ref, hp, Strategy()).step
    step = build_step(folded, hp, Strategy(clip_via_lr=True)).step
    assert "clip: folded into the SGD learning rate" in step.report
    for _ in range(3):
        norm_ref = ref_step([batch]).grad_norm
        norm = step([batch]).grad_norm
        assert float(norm) > hp.max_grad_norm                          # the clip is active
        torch.testing.assert_close(norm, norm_ref, rtol=1e-5, atol=0)
    for a, b in zip(ref.parameters(), folded.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        assert b.grad is None                                          # gradients released as usual
    adam = build_step(_Regressor(), hp.replace(optimizer="adam"), Strategy(clip_via_lr=True)).step
    assert not adam.clip_via_lr
    assert "clip: not folded into the learning rate (the optimizer is Adam, not plain SGD)" in adam.report


def test_a_phased_step_folds_the_clip_per_phase_as_a_one_loss_step_does() -> None:
    """Each phase's clip folds into its own SGD step; Adam phases clip their gradients, and say so."""
    from hotloop.compose.build import build_run
    tiny = ("image_size=32,gen_filters=4,disc_filters=4,gen_blocks=1,batch_size=2,pool_size=2,train_examples=16,"
            "max_grad_norm=0.5")
    run = build_run("shapes_unpaired", "cyclegan", "cyclegan_small", tiny)
    adam = build_step(run.model, run.hp, Strategy(fused_optimizer=False, clip_via_lr=True)).step
    assert "clip: not folded into the learning rate (the optimizer is Adam, not plain SGD)" in adam.report
    assert not adam.clip_via_lr
    batch = next(iter(run.problem.reader("train", run.hp)))
    sgd_hp = run.hp.replace(optimizer="sgd", learning_rate=0.01, weight_decay=0.0)
    results = {}
    for fold in (False, True):
        torch.manual_seed(0)
        model = build_run("shapes_unpaired", "cyclegan", "cyclegan_small", tiny).model
        step = build_step(model, sgd_hp, Strategy(fused_optimizer=False, clip_via_lr=fold)).step
        assert step.clip_via_lr == fold and len(step.phases) == 2
        torch.manual_seed(1)
        results[fold] = (step([batch]), [p.detach().clone() for p in model.parameters()])
    (ref, ref_params), (folded, params) = results[False], results[True]
    assert "clip: folded into the SGD learning rate" in step.report
    torch.testing.assert_close(folded.grad_norm, ref.grad_norm, rtol=1e-5, atol=0)
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
