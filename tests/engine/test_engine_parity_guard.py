"""check_parity rejects what it must: a bf16 step that does not (fully) update the weights.

Loss trajectories alone cannot tell: at a small learning rate a step that never
updates the weights keeps its losses within the bf16 loss tolerance (3e-2). The
update check compares ``final - initial`` parameters with the reference update.
"""
from __future__ import annotations

import pytest
import torch

from hotloop.engine import Strategy
from hotloop.engine.parity import ParityCase, check_parity, update_error, update_tolerance
from hotloop.optim import build_optimizer
from hotloop.testing import model_case

BF16 = Strategy(precision="bf16")


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


def test_update_error_against_hand_computed_values():
    start = [torch.zeros(2), torch.zeros(1)]
    ref = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]        # |d_ref| = 5
    assert update_error(start, ref, start, ref) == 0.0
    assert update_error(start, start, start, ref) == pytest.approx(1.0)       # no update at all
    half = [torch.tensor([1.5, 0.0]), torch.tensor([2.0])]
    assert update_error(start, half, start, ref) == pytest.approx(0.5)
    wrong_way = [torch.tensor([-3.0, 0.0]), torch.tensor([4.0])]             # |(-6, 0, 0)| / 5
    assert update_error(start, wrong_way, start, ref) == pytest.approx(1.2)
    assert update_error(start, half, start, start) == float("inf")            # only the reference is still


def test_correct_bf16_step_passes_with_a_measured_nonzero_update_diff():
    result = check_parity(_with_update_scale(1.0), BF16)
    assert result.ok, result.reason()
    assert result.update_tol == update_tolerance(BF16) == 0.3
    assert 0.0 < result.update_diff < 0.15          # bf16 really changes the update, well inside the bound


@pytest.mark.parametrize("scale, expected", [(0.0, 1.0), (0.5, 0.5)])
def test_bf16_step_with_missing_or_half_updates_is_rejected_though_losses_agree(scale, expected):
    result = check_parity(_with_update_scale(scale), BF16)
    assert _loss_rel_diff(result) <= result.tol      # a loss-only check would have passed it
    assert not result.ok
    assert result.update_diff == pytest.approx(expected, abs=0.02)
    assert "parameter update" in result.reason()


def test_fp32_non_bitwise_comparison_checks_updates_too():
    result = check_parity(_with_update_scale(0.0), Strategy(fused_optimizer=True), tol=1e-5)
    assert not result.ok and result.update_diff == pytest.approx(1.0)
    same = check_parity(_with_update_scale(1.0), Strategy(fused_optimizer=True), tol=1e-5)
    assert same.ok and same.update_diff == 0.0      # foreach Adam on this tiny case: the same update
