"""check_parity rejects what it must: a bf16 step that does not (fully) update the weights.

Loss trajectories alone cannot tell: at a small learning rate a step that never
updates the weights keeps its losses within the bf16 loss tolerance (3e-2). The
update check compares ``d = final - initial`` with the reference's update in size
and direction.
"""
from __future__ import annotations

import pytest
import torch

from hotloop.engine import Strategy
from hotloop.engine.parity import (ParityCase, UpdateTolerance, check_parity, compare_updates,
                                   update_tolerance)
from hotloop.optim import build_optimizer
from hotloop.testing import model_case

BF16 = Strategy(precision="bf16")


@pytest.fixture(autouse=True)
def one_thread():
    """Shared cores: one intra-op thread keeps these checks fast under load."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _with_update_scale(scale: float, learning_rate: float = 5e-4):
    """build() for the tiny MLP whose *second* call (the strategy's run) scales the learning rate."""
    base = model_case("mlp", "tiny", steps=3)
    calls: list[int] = []

    def build() -> ParityCase:
        case = base()
        calls.append(1)
        lr = learning_rate * (scale if len(calls) == 2 else 1.0)
        hp = case.optimizer.replace(learning_rate=lr)
        return ParityCase(case.model, lambda params, fused: build_optimizer(params, hp, fused=fused),
                          case.batches, max_grad_norm=case.max_grad_norm)
    return build


def _loss_rel_diff(result) -> float:
    return max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(result.losses, result.losses_ref))


def test_compare_updates_against_hand_computed_values():
    start = [torch.zeros(2), torch.zeros(1)]
    ref = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]        # |d_ref| = 5
    same = compare_updates(start, ref, start, ref)
    assert (same.scale, same.cosine, same.rel_diff) == (1.0, 1.0, 0.0)
    none = compare_updates(start, start, start, ref)                        # no update at all
    assert (none.scale, none.cosine) == (0.0, 0.0) and none.rel_diff == pytest.approx(1.0)
    half = compare_updates(start, [torch.tensor([1.5, 0.0]), torch.tensor([2.0])], start, ref)
    assert half.scale == pytest.approx(0.5) and half.cosine == pytest.approx(1.0)
    wrong_way = compare_updates(start, [torch.tensor([-3.0, 0.0]), torch.tensor([4.0])], start, ref)
    assert wrong_way.scale == pytest.approx(1.0) and wrong_way.cosine == pytest.approx(7 / 25)
    assert wrong_way.rel_diff == pytest.approx(1.2)                         # |(-6, 0, 0)| / 5
    still = compare_updates(start, start, start, start)
    assert still.within(UpdateTolerance(0.0, 1.0))                         # neither moved: equal
    assert compare_updates(start, ref, start, start).scale == float("inf")  # only the reference is still
    tol = UpdateTolerance(0.3, 0.5)
    assert same.within(tol) and not none.within(tol) and not half.within(tol) and not wrong_way.within(tol)


def test_correct_bf16_step_passes_with_a_measured_nonzero_update_difference():
    result = check_parity(_with_update_scale(1.0), BF16)
    assert result.ok, result.reason()
    assert result.update_tol == update_tolerance(BF16) == UpdateTolerance(0.3, 0.5)
    assert 0.0 < result.update.rel_diff < 0.15          # bf16 really changes the update ...
    assert abs(result.update.scale - 1) < 0.05 and result.update.cosine > 0.95   # ... but not its size or way


@pytest.mark.parametrize("scale", [0.0, 0.5])
def test_bf16_step_with_missing_or_half_updates_is_rejected_though_losses_agree(scale):
    result = check_parity(_with_update_scale(scale), BF16)
    assert _loss_rel_diff(result) <= result.tol      # a loss-only check would have passed it
    assert not result.ok
    assert result.update.scale == pytest.approx(scale, abs=0.02)
    assert result.reason().startswith("parameter update wrong: size")


def test_fp32_non_bitwise_comparison_checks_updates_too():
    result = check_parity(_with_update_scale(0.0), Strategy(fused_optimizer=True), tol=1e-5)
    assert not result.ok and result.update.scale == 0.0
    same = check_parity(_with_update_scale(1.0), Strategy(fused_optimizer=True), tol=1e-5)
    assert same.ok and same.update.rel_diff == 0.0   # foreach Adam on this tiny case: the same update
