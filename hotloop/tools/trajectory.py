"""The trial-trajectory parity guard, aware of models whose training is chaotic.

A candidate's per-step trial losses are compared with eager fp32's: the worst
relative difference must stay within the engine's tolerance for the candidate
(0 = bitwise). Some models amplify any rounding difference. Mask R-CNN, for
one, picks its proposals by score and IoU, so a one-ulp change of the weights
picks other boxes within a few steps. Measured on ``mask_rcnn_shapes`` over 12
trial steps (2-core AMD EPYC): eager from weights moved by one ulp differs from
eager by up to 3.8e-2; the foreach Adam update, the same math, 6.3e-2; bf16 4.6e-2.
On such a model no tolerance below that *chaos floor* can be met, not even by
a change that keeps the math.

So when a candidate that wins on time misses a non-zero tolerance, the guard
measures the floor once (:func:`chaos_floor`): eager fp32 re-run from the same
weights moved by about one fp32 ulp (relative ``CHAOS_PERTURBATION``, random
signs), on the same batches and random stream, once for each of ``FLOOR_SEEDS``
sign patterns; the floor is the median of those runs' deviations. The candidate
then passes if it stays within ``CHAOS_FACTOR`` times that floor (the same-math
foreach update measured 1.7x a one-sample floor). A single pattern is a noisy
sample of a chaotic trajectory: on ``cyclegan_small`` (2-core EPYC, 3 steps of the
zoo's batches) four patterns moved the losses by 3.3e-5 to 3.8e-4 on the same
batches, and an inductor step, 2.6e-4 from eager, passed or failed by which pattern
was drawn (``docs/data/chaos_floor_spread.json``). A bitwise claim is never loosened,
and the winner still has to pass :func:`hotloop.engine.parity.check_parity` over
three steps.

A reduced-precision candidate (bf16, fp16) is held to the floor of its own
precision: eager fp32 re-run from the same weights rounded to that dtype, the
rounding autocast applies to every matmul and convolution input. On a chaotic
model the one-ulp floor is still small after three steps while that rounding
already moves the trajectory. Measured on ``yolov3_shapes`` over 3 steps
(2-core AMD EPYC): one-ulp move 7.0e-3, weights rounded to bf16 3.3e-2,
bf16 autocast 3.7e-2 (its first-step loss within 2.2e-3). On a smooth model
the rounding floor stays far below the bf16 tolerance of 3e-2, so nothing is
loosened there.
"""
from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch

from .trials import Trial, TrialRunner

__all__ = ["CHAOS_PERTURBATION", "CHAOS_FACTOR", "FLOOR_SEEDS", "ROUNDING_DTYPES", "worst_rel_diff",
           "worst_loss_diff", "perturb_weights", "chaos_floor", "ChaosFloors", "judge_trajectory"]

CHAOS_PERTURBATION = 2.0 ** -22     # relative weight move: about one fp32 ulp (2**-23 is half of one)
CHAOS_FACTOR = 4.0
#: seeds of the one-ulp sign patterns whose median deviation is the fp32 floor (a rounding floor,
#: bf16 or fp16, is deterministic: one run)
FLOOR_SEEDS = (0, 1, 2)


def worst_rel_diff(losses: Sequence[float], reference: Sequence[float]) -> float:
    """Worst ``|a - b| / max(|b|, 1)`` over the steps both lists have."""
    return max((abs(a - b) / max(abs(b), 1.0) for a, b in zip(losses, reference)), default=0.0)


def worst_loss_diff(trial: Trial, baseline: Trial) -> tuple[float, int]:
    """:func:`worst_rel_diff` of two trials' losses, and the number of steps compared."""
    return worst_rel_diff(trial.losses, baseline.losses), min(len(trial.losses), len(baseline.losses))


#: the weight dtype whose rounding is a reduced-precision candidate's floor
ROUNDING_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def perturb_weights(model: torch.nn.Module, precision: str, seed: int = 0) -> None:
    """Round the weights to ``precision``'s dtype, or (fp32) move each by about one ulp, the
    signs drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if precision in ROUNDING_DTYPES:
                param.copy_(param.to(ROUNDING_DTYPES[precision]))
            else:
                signs = torch.randint(0, 2, param.shape, generator=generator).to(param) * 2 - 1
                param.mul_(1 + CHAOS_PERTURBATION * signs)


def chaos_floor(runner: TrialRunner, baseline: Trial, steps: int, precision: str = "fp32") -> float:
    """Worst loss difference between eager fp32 and eager fp32 from perturbed weights: rounded to
    ``precision``'s dtype (bf16, fp16), or (fp32) the median over ``FLOOR_SEEDS`` of one-ulp moves."""
    seeds = FLOOR_SEEDS[:1] if precision in ROUNDING_DTYPES else FLOOR_SEEDS
    deviations = []
    for seed in seeds:
        deviation = _moved_deviation(runner, baseline, steps, precision, seed)
        if deviation is None:            # no floor measured: the plain tolerance decides
            return 0.0
        deviations.append(deviation)
    return statistics.median(deviations)


class ChaosFloors:
    """The chaos floors of one tune, each measured once and only when a judgement needs it, by the
    steps compared and the precision whose rounding the candidate brings (bf16 GEMM formulations:
    bf16)."""

    def __init__(self, runner: TrialRunner, baseline: Trial) -> None:
        self.runner, self.baseline = runner, baseline
        self.measured: dict[tuple[int, str], float] = {}

    def for_trial(self, trial: Trial) -> Callable[[int], float]:
        """``floor(steps)`` for ``trial``'s precision (:func:`judge_trajectory`'s argument)."""
        precision = "bf16" if trial.strategy.formulation.bf16_gemms else trial.strategy.precision

        def floor(steps: int) -> float:
            if (steps, precision) not in self.measured:
                self.measured[steps, precision] = chaos_floor(self.runner, self.baseline, steps, precision)
            return self.measured[steps, precision]
        return floor


def _moved_deviation(runner: TrialRunner, baseline: Trial, steps: int, precision: str, seed: int) -> float | None:
    """:func:`worst_loss_diff` of eager from perturbed weights over ``steps`` steps (None: it failed)."""
    how = f"rounded to {precision}" if precision in ROUNDING_DTYPES else f"moved 1 ulp (signs of seed {seed})"
    moved = Trial(f"eager, weights {how}", baseline.strategy, "chaos floor", warmup=0)
    if not runner.prepare(moved):
        return None
    perturb_weights(moved.runner.model, precision, seed)
    try:
        for _ in range(steps):
            runner.step(moved)
            if moved.status != "ok":
                return None
        return worst_loss_diff(moved, baseline)[0]
    finally:
        runner.release([moved])


def judge_trajectory(trial: Trial, baseline: Trial, tol: float,
                     floor: Callable[[int], float] | None) -> tuple[bool, str]:
    """(ok, parity text) for ``trial``; ``floor(steps)`` measures the chaos floor when needed
    (``None``: the plain tolerance only)."""
    worst, n = worst_loss_diff(trial, baseline)
    if tol == 0:
        ok = all(a == b for a, b in zip(trial.losses[:n], baseline.losses[:n]))
        return ok, (f"ok (bitwise, {n} steps)" if ok else
                    f"REJECTED (not bitwise: loss rel diff {worst:.2e} over {n} steps)")
    if worst <= tol:
        return True, f"ok (rel {worst:.1e} <= {tol:.0e}, {n} steps)"
    if floor is None:
        return False, f"REJECTED (loss rel diff {worst:.2e} > tol {tol:.0e} over {n} steps)"
    measured = floor(n)
    allowed = CHAOS_FACTOR * measured
    if worst <= allowed:
        return True, (f"ok (rel {worst:.1e} > {tol:.0e} but <= {CHAOS_FACTOR:g} x chaos floor "
                      f"{measured:.1e}, {n} steps)")
    return False, (f"REJECTED (loss rel diff {worst:.2e} > tol {tol:.0e} and > {CHAOS_FACTOR:g} x chaos "
                   f"floor {measured:.1e} over {n} steps)")
