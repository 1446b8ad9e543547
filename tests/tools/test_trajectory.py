"""The trajectory parity guard: plain tolerance, bitwise claims, and the chaos floor."""
from __future__ import annotations

import pytest
import torch

from hotloop.engine.strategy import Strategy
from hotloop.tools.autotune import read_batches
from hotloop.tools.isolation import preserved_process_state
from hotloop.tools.proposals import baseline_strategy
from hotloop.tools.trajectory import CHAOS_FACTOR, chaos_floor, judge_trajectory
from hotloop.tools.trials import Trial, TrialRunner
from hotloop.compose.build import build_run


def _trial(losses: list[float]) -> Trial:
    trial = Trial("t", Strategy(), "test")
    trial.losses = list(losses)
    return trial


def _no_floor(steps: int) -> float:
    raise AssertionError("the chaos floor must not be measured here")


BASE = _trial([2.0, 1.5, 1.2, 1.0])


def test_within_the_tolerance_passes_without_measuring_the_floor():
    ok, text = judge_trajectory(_trial([2.0, 1.5, 1.2, 1.001]), BASE, 3e-2, _no_floor)
    assert ok and text.startswith("ok (rel 1.0e-03")


def test_a_bitwise_claim_is_never_loosened():
    ok, text = judge_trajectory(_trial([2.0, 1.5, 1.2, 1.0 + 1e-6]), BASE, 0.0, _no_floor)
    assert not ok and "not bitwise" in text
    assert judge_trajectory(_trial([2.0, 1.5, 1.2, 1.0]), BASE, 0.0, _no_floor)[0]


def test_a_miss_within_the_chaos_floor_passes_and_beyond_it_is_rejected():
    calls: list[int] = []

    def floor(steps: int) -> float:
        calls.append(steps)
        return 0.02

    near = _trial([2.0, 1.5, 1.2, 1.0 + 0.9 * CHAOS_FACTOR * 0.02])
    ok, text = judge_trajectory(near, BASE, 3e-2, floor)
    assert ok and "chaos floor 2.0e-02" in text and calls == [4]
    far = _trial([2.0, 1.5, 1.2, 1.0 + 1.1 * CHAOS_FACTOR * 0.02])
    ok, text = judge_trajectory(far, BASE, 3e-2, floor)
    assert not ok and "REJECTED" in text
    ok, text = judge_trajectory(far, BASE, 3e-2, None)          # no floor offered: the plain tolerance
    assert not ok and "chaos" not in text


def _runner(problem: str, model: str, hparams: str, steps: int) -> tuple[TrialRunner, Trial]:
    run = build_run(problem, model, hparams, None, device=torch.device("cpu"))
    batches, _ = read_batches(run.problem, run.hp, 4, torch.device("cpu"))
    runner = TrialRunner(run.model, run.hp, batches, torch.device("cpu"), warmup=0)
    baseline = Trial("eager", baseline_strategy(), "reference")
    assert runner.prepare(baseline)
    for _ in range(steps):
        runner.step(baseline)
    return runner, baseline


@pytest.mark.timeout(180)
def test_the_floor_tells_a_smooth_model_from_a_chaotic_one():
    """Over 12 steps from one-ulp-moved weights an MLP's losses move by about 1e-4 (Adam's
    first updates follow the sign of noise-level gradients); Mask R-CNN's, which selects
    proposals by score, by a few 1e-2 (measured 7.6e-5 and 4.3e-2)."""
    with preserved_process_state():
        smooth = chaos_floor(*_runner("algorithmic_copy", "mlp", "mlp_algorithmic", 12), 12)
        chaotic = chaos_floor(*_runner("detection_shapes", "mask_rcnn", "mask_rcnn_tiny", 12), 12)
    assert smooth < 1e-3, smooth
    assert chaotic > 1e-2 and chaotic > 50 * smooth, (smooth, chaotic)


def test_a_reduced_precision_floor_rounds_the_weights_to_that_dtype():
    from hotloop.tools.trajectory import perturb_weights
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    before = [p.detach().clone() for p in model.parameters()]
    perturb_weights(model, "bf16")
    for old, new in zip(before, model.parameters()):
        assert torch.equal(new, new.to(torch.bfloat16).float())     # representable in bf16
        assert torch.equal(new, old.to(torch.bfloat16).float())     # and the nearest such value
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    perturb_weights(model, "fp32")                                             # one-ulp moves, not rounding
    assert not torch.equal(model.weight, model.weight.to(torch.bfloat16).float())


@pytest.mark.timeout(180)
def test_the_bf16_rounding_floor_of_a_smooth_model_loosens_nothing():
    """Rounding an MLP's weights to bf16 moves its 12-step losses far less than the bf16
    tolerance of 3e-2 divided by CHAOS_FACTOR, so only a chaotic model gains from the floor."""
    with preserved_process_state():
        floor = chaos_floor(*_runner("algorithmic_copy", "mlp", "mlp_algorithmic", 12), 12, "bf16")
    assert 0 < floor < 3e-2 / CHAOS_FACTOR, floor


def test_the_fp32_floor_is_the_median_over_the_sign_patterns(monkeypatch):
    """One sign pattern is a noisy sample of a chaotic trajectory: the floor is the median over
    FLOOR_SEEDS; a rounding floor (bf16) is deterministic and runs once."""
    from hotloop.tools import trajectory
    seen: list[tuple[str, int]] = []
    deviations = {0: 3.3e-5, 1: 3.8e-4, 2: 1.5e-4}      # cyclegan_small's first three patterns

    def moved(runner, baseline, steps, precision, seed):
        seen.append((precision, seed))
        return deviations[seed]
    monkeypatch.setattr(trajectory, "_moved_deviation", moved)
    assert trajectory.FLOOR_SEEDS == (0, 1, 2)
    assert chaos_floor(None, BASE, 3) == 1.5e-4
    assert seen == [("fp32", 0), ("fp32", 1), ("fp32", 2)]
    seen.clear()
    assert chaos_floor(None, BASE, 3, "bf16") == 3.3e-5 and seen == [("bf16", 0)]
    monkeypatch.setattr(trajectory, "_moved_deviation", lambda *a: None)   # a failed run: no floor
    assert chaos_floor(None, BASE, 3) == 0.0


def test_the_sign_patterns_differ_by_seed():
    from hotloop.tools.trajectory import perturb_weights
    torch.manual_seed(0)
    a = torch.nn.Linear(32, 32)
    b = torch.nn.Linear(32, 32)
    b.load_state_dict(a.state_dict())
    perturb_weights(a, "fp32", 0)
    perturb_weights(b, "fp32", 1)
    assert not torch.equal(a.weight, b.weight)


def test_each_chaos_floor_is_measured_once_per_steps_and_precision(monkeypatch):
    from hotloop.tools import trajectory
    measured: list[tuple[int, str]] = []

    def floor(runner, baseline, steps, precision="fp32"):
        measured.append((steps, precision))
        return 1e-3 * steps
    monkeypatch.setattr(trajectory, "chaos_floor", floor)
    floors = trajectory.ChaosFloors(runner=None, baseline=BASE)
    fp32, bf16 = Trial("a", Strategy(precision="fp32"), "t"), Trial("b", Strategy(precision="bf16"), "t")
    bf16_gemms = Trial("c", Strategy(precision="fp32", ce_gemm_dtype="bf16", fused_ce=True), "t")
    assert floors.for_trial(fp32)(12) == pytest.approx(1.2e-2) and floors.for_trial(fp32)(12) == pytest.approx(1.2e-2)
    floors.for_trial(fp32)(3)
    floors.for_trial(bf16)(12)
    floors.for_trial(bf16_gemms)(12)         # bf16 GEMM operands: the bf16 floor, measured already
    assert measured == [(12, "fp32"), (3, "fp32"), (12, "bf16")]
