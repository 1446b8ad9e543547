"""Parity check: a strategy must train exactly like the plain eager fp32 loop.

``check_parity(build, strategy, steps=K)`` builds two fresh copies of the same
problem (``build()`` must be deterministic: fixed seed), trains ``K`` steps
with the reference (eager, fp32, per-tensor optimizer loop) and with
``strategy``, and compares the loss trajectories, the final parameters (when
bitwise) and the parameter updates (otherwise).

Loss tolerances (``tol=None``): 0 (bitwise) for fp32 on the eager and graph
backends, 1e-5 relative with ``fast_math`` passes, 1e-4 relative for ``backend=inductor`` (it re-fuses arithmetic) and
for CUDA ``fused`` optimizer kernels (1-ulp differences per update), and
3e-2 relative for bf16 (autocast rounds every matmul input to 8 bits of mantissa).

Update check (every non-bitwise comparison): ``d = final - initial`` over all
parameters is compared with the reference's ``d_ref`` in size and in direction.
``|d| / |d_ref|`` must lie within ``1 ± scale`` and ``cos(d, d_ref)`` must reach
``min_cosine`` (:func:`update_tolerance`: ±0.3 and 0.5 for bf16/fp16, ±0.1 and
0.9 for fp32). A step that never updates the weights (size 0), or updates them
by half, fails however close its losses stay. A step that moves them the wrong way
fails too (low cosine). The norm of the difference, ``|d - d_ref| / |d_ref|``, is
reported but not bounded. Adam's first updates are about ``±lr`` per entry, so
under bf16 every gradient entry at noise level may flip its sign. Measured over 3
steps on the tiny built-in cases, that puts the difference between 0.002 and 0.89.
Over the same steps the sizes stay within 1 ± 0.011 and the cosines at or above 0.6
(yolov3, whose bf16 losses already differ by 9%, is the exception at -0.06).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..hparams import HParams
from ..models.formulation import Formulation
from ..problems.base import Batch
from .strategy import Strategy

__all__ = ["ParityCase", "ParityResult", "UpdateComparison", "UpdateTolerance", "check_parity",
           "compare_updates", "default_tolerance", "update_tolerance", "run_steps", "REFERENCE"]

OptimizerFactory = Callable[[list[nn.Parameter], bool], torch.optim.Optimizer]

#: The reference every strategy is compared with: the plain PyTorch loop.
REFERENCE = Strategy(backend="eager", fused_optimizer=False, precision="fp32", prefetch=0)


@dataclass
class ParityCase:
    """What ``build()`` returns: a fresh model, how to make its optimizer, and the batches.

    ``optimizer`` is either hparams (``hotloop.optim.build_optimizer``) or a
    factory ``fn(params, fused) -> Optimizer``. ``batches[i]`` is the batch of
    step ``i`` (a list of batches means gradient accumulation over micro-batches).
    """

    model: nn.Module
    optimizer: HParams | OptimizerFactory
    batches: Sequence[Batch | list[Batch]]
    loss_fn: Callable[..., Any] | None = None
    max_grad_norm: float = 0.0
    state: Any = None
    #: the case's own formulation (e.g. a capturable LSTM kernel): both the reference and the
    #: strategy under test compute with it, unless the strategy sets a formulation field itself
    formulation: Formulation = field(default_factory=Formulation)


@dataclass(frozen=True)
class UpdateTolerance:
    """``|d| / |d_ref|`` within ``1 ± scale`` and ``cos(d, d_ref) >= min_cosine``."""

    scale: float
    min_cosine: float


@dataclass(frozen=True)
class UpdateComparison:
    """A strategy's parameter update ``d`` against the reference's ``d_ref`` (all parameters)."""

    scale: float                      # |d| / |d_ref| (1 when both are 0, inf when only d_ref is)
    cosine: float                     # cos(d, d_ref) (1 when both are 0, 0 when one of them is)
    rel_diff: float                   # |d - d_ref| / |d_ref| (reported, not bounded)

    def within(self, tol: UpdateTolerance) -> bool:
        return abs(self.scale - 1.0) <= tol.scale and self.cosine >= tol.min_cosine

    def describe(self, tol: UpdateTolerance) -> str:
        verdict = "ok" if self.within(tol) else "wrong"
        return (f"parameter update {verdict}: size |d|/|d_ref| {self.scale:.2f} (allowed 1 ± {tol.scale:g}), "
                f"direction cos {self.cosine:.2f} (min {tol.min_cosine:g}), rel diff {self.rel_diff:.2e}")


@dataclass
class ParityResult:
    ok: bool
    max_abs_diff: float               # over losses and final parameters
    losses_ref: list[float]
    losses: list[float]
    tol: float                        # relative tolerance used (0 = bitwise)
    fallback_reason: str | None = None  # set when the strategy's step fell back to eager
    report: list[str] = field(default_factory=list)
    update: UpdateComparison | None = None    # the parameter updates (None: not compared)
    update_tol: UpdateTolerance | None = None

    def reason(self) -> str:
        """One line: what failed (or that it passed)."""
        if self.ok:
            return "ok"
        if self.update is not None and self.update_tol is not None and not self.update.within(self.update_tol):
            return self.update.describe(self.update_tol)
        return f"max diff {self.max_abs_diff:.2e} > tol {self.tol:.0e}"


#: a formulation that keeps fp32 (chunked cross-entropy, another LSTM kernel, the clip folded
#: into the learning rate) sums in another order: a few ulps per step
FORMULATION_TOL = 1e-5


def default_tolerance(strategy: Strategy, device: torch.device | str = "cpu") -> float:
    """The relative tolerance :func:`check_parity` uses when ``tol`` is None."""
    if strategy.precision != "fp32" or strategy.formulation.bf16_gemms:
        return 3e-2
    if strategy.formulation.changed() or strategy.clip_via_lr:   # same math, other fp32 rounding
        return FORMULATION_TOL
    if strategy.backend == "inductor":
        return 1e-4
    if strategy.fast_math and strategy.graph_passes:
        return 1e-5
    if strategy.fused_optimizer and torch.device(device).type == "cuda":
        return 1e-4
    return 0.0


def update_tolerance(strategy: Strategy) -> UpdateTolerance:
    """The update bounds of a non-bitwise comparison (see the module doc)."""
    reduced = strategy.precision != "fp32" or strategy.formulation.bf16_gemms
    return UpdateTolerance(0.3, 0.5) if reduced else UpdateTolerance(0.1, 0.9)


def compare_updates(initial: Sequence[torch.Tensor], final: Sequence[torch.Tensor],
                    initial_ref: Sequence[torch.Tensor], final_ref: Sequence[torch.Tensor]) -> UpdateComparison:
    """Size, direction and relative difference of ``d = final - initial`` against ``d_ref``."""
    dot = norm2 = norm2_ref = diff2 = 0.0
    for a0, a1, b0, b1 in zip(initial, final, initial_ref, final_ref):
        d, d_ref = a1.double() - a0.double(), b1.double() - b0.double()
        dot += float((d * d_ref).sum())
        norm2 += float(d.pow(2).sum())
        norm2_ref += float(d_ref.pow(2).sum())
        diff2 += float((d - d_ref).pow(2).sum())
    if norm2_ref == 0.0:
        return UpdateComparison(1.0, 1.0, 0.0) if norm2 == 0.0 else UpdateComparison(
            float("inf"), 0.0, float("inf"))
    cosine = dot / (norm2 * norm2_ref) ** 0.5 if norm2 > 0 else 0.0
    return UpdateComparison((norm2 / norm2_ref) ** 0.5, cosine, (diff2 / norm2_ref) ** 0.5)


def _as_case(built: Any) -> ParityCase:
    if isinstance(built, ParityCase):
        return built
    if isinstance(built, tuple) and len(built) == 3:
        return ParityCase(*built)
    raise TypeError("check_parity: build() must return a ParityCase or (model, optimizer, batches)")


def run_steps(case: ParityCase, strategy: Strategy, steps: int) -> tuple[list[float], list[torch.Tensor], Any]:
    """Train ``steps`` steps of ``case`` under ``strategy``; return (losses, final params, step)."""
    from .build import build_step
    device = next(case.model.parameters()).device
    hp = case.optimizer if isinstance(case.optimizer, HParams) else HParams()
    factory = None if isinstance(case.optimizer, HParams) else case.optimizer
    strategy = strategy.replace(**{**case.formulation.changed(), **strategy.formulation.changed()})
    step = build_step(case.model, hp, strategy, loss_fn=case.loss_fn, optimizer=factory,
                      max_grad_norm=case.max_grad_norm).step
    state, losses = case.state, []
    if len(case.batches) < steps:
        raise ValueError(f"check_parity: build() gave {len(case.batches)} batches for {steps} steps")
    for i in range(steps):
        micro = case.batches[i]
        micro = micro if isinstance(micro, list) else [micro]
        micro = [{k: v.to(device) for k, v in b.items()} for b in micro]
        result = step(micro, state)
        state = result.state
        losses.append(float(result.loss))
    params = [p.detach().clone() for p in case.model.parameters()]
    return losses, params, step


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    diff = (a.double() - b.double()).abs()
    scale = b.double().abs().clamp(min=1.0)
    return float(diff.max()) if diff.numel() else 0.0, float((diff / scale).max()) if diff.numel() else 0.0


def check_parity(build: Callable[[], Any], strategy: Strategy, steps: int = 3,
                 tol: float | None = None, *, compare_params: bool | None = None,
                 update_tol: UpdateTolerance | None = None) -> ParityResult:
    """Train ``steps`` steps with eager fp32 and with ``strategy`` from two ``build()`` calls.

    ``ok`` when every loss (and, with ``compare_params``, every final parameter) agrees within
    ``tol`` relative (max(|ref|, 1) scaled); ``tol=0`` demands bitwise equality.
    Parameters are compared element by element by default only when ``tol == 0``: under Adam a
    rounding-level change in a near-zero gradient entry moves that parameter by up to ``lr``
    (m/sqrt(v) normalises it). With ``tol > 0`` the whole update is compared instead, in size
    and direction, within ``update_tol`` (default :func:`update_tolerance`), so a step that
    leaves the weights unchanged (or moves them the wrong way) fails even when its losses stay close.
    """
    ref_case = _as_case(build())
    device = next(ref_case.model.parameters()).device
    tol = default_tolerance(strategy, device) if tol is None else tol
    compare_params = tol == 0 if compare_params is None else compare_params
    update_tol = update_tolerance(strategy) if update_tol is None else update_tol
    initial_ref = [p.detach().clone() for p in ref_case.model.parameters()]
    losses_ref, params_ref, _ = run_steps(ref_case, REFERENCE, steps)
    case = _as_case(build())
    initial = [p.detach().clone() for p in case.model.parameters()]
    losses, params, step = run_steps(case, strategy, steps)
    abs_max, rel_max = _rel_diff(torch.tensor(losses), torch.tensor(losses_ref))
    if compare_params:
        for p, q in zip(params, params_ref):
            a, r = _rel_diff(p, q)
            abs_max, rel_max = max(abs_max, a), max(rel_max, r)
    ok = rel_max <= tol if tol > 0 else abs_max == 0.0
    update = None
    if tol > 0:
        update = compare_updates(initial, params, initial_ref, params_ref)
        ok = ok and update.within(update_tol)
    return ParityResult(ok, abs_max, losses_ref, losses, tol,
                        getattr(step, "fallback_reason", None), list(getattr(step, "report", [])),
                        update, update_tol if tol > 0 else None)
