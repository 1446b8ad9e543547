"""Parity check: a strategy must train exactly like the plain eager fp32 loop.

``check_parity(build, strategy, steps=K)`` builds two fresh copies of the same
problem (``build()`` must be deterministic: fixed seed), trains ``K`` steps
with the reference (eager, fp32, per-tensor optimizer loop) and with
``strategy``, and compares the loss trajectories, the final parameters (when
bitwise) and the parameter updates (otherwise).

Loss tolerances (``tol=None``): 0 (bitwise) for fp32 on the eager and graph
backends, 1e-5 relative with ``fast_math`` passes, 1e-4 relative for ``backend=inductor`` (it re-fuses arithmetic), for ``channels_last`` and
``cudnn_benchmark`` (other convolution kernels, other fp32 rounding) and
for ``fused`` optimizer kernels (CUDA, or ``fused_kernel`` on CPU: 1-ulp differences per update), and
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

Random streams: each run starts from torch's generator seeded right after its ``build()``
(``STREAM_SEEDS[0]`` for the reference and the strategy; the caller's streams are restored), so
dropout draws the same masks in both even when ``build()`` only copies a model.

Random-stream rule (a strategy that draws other random numbers, :func:`changes_random_stream`:
``dropout_masks=bits16``): no trajectory can match the reference's, so the reference is trained
twice, from streams A and B (``STREAM_SEEDS[0]``, ``[1]``), and the strategy from stream C. The
reference's own deviation between A and B is the yardstick. The strategy passes when (1) its
worst relative loss difference from A is at most ``STREAM_FACTOR`` (4) x that of B, plus
``STREAM_FLOOR`` (1e-4) plus the tolerance of its rounding (:func:`default_tolerance`, 0 for
bits16 alone), and (2) its update compared with A's (:func:`compare_updates`) is as close as B's:
size ``|d|/|d_A|`` within ``|B's size - 1| + STREAM_MARGIN`` (0.1) of 1 and cosine at least
B's cosine minus ``STREAM_MARGIN`` (reduced precision adds its update slack, 0.2). Losses over a
few steps are noisy, so (1) only bounds gross errors; the update, summed over every parameter,
is the sharp test: masks that drop everything leave the masked layers without gradient, and
their update's cosine with A's falls far below B's (``tests/engine/test_random_stream_parity.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..hparams import HParams
from ..models.formulation import RANDOM_STREAM_FIELDS, Formulation
from ..problems.base import Batch
from .strategy import Strategy

__all__ = ["ParityCase", "ParityResult", "UpdateComparison", "UpdateTolerance", "check_parity",
           "compare_updates", "default_tolerance", "update_tolerance", "run_steps", "REFERENCE",
           "changes_random_stream", "STREAM_SEEDS", "STREAM_FACTOR", "STREAM_FLOOR", "STREAM_MARGIN"]

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
    #: random-stream rule only: the reference's second run (stream B), its loss deviation from
    #: run A and its update against A's; ``tol`` is then the allowed loss deviation
    losses_alt: list[float] | None = None
    stream_noise: float | None = None
    update_alt: UpdateComparison | None = None
    loss_rel_diff: float = 0.0                # worst relative loss difference from the reference

    def stream_line(self) -> str:
        """The random-stream rule's comparison, one line (empty for the other rules)."""
        if self.stream_noise is None or self.update is None or self.update_alt is None:
            return ""
        return (f"random-stream rule: loss rel diff {self.loss_rel_diff:.1e} (allowed {self.tol:.1e}: "
                f"{STREAM_FACTOR:g} x stream B's {self.stream_noise:.1e} + {STREAM_FLOOR:g}), update cos "
                f"{self.update.cosine:.2f} size {self.update.scale:.2f} against stream B's cos "
                f"{self.update_alt.cosine:.2f} size {self.update_alt.scale:.2f} (margin {STREAM_MARGIN:g})")

    def reason(self) -> str:
        """One line: what failed (or that it passed)."""
        if self.ok:
            return "ok"
        if self.update is not None and self.update_tol is not None and not self.update.within(self.update_tol):
            return self.update.describe(self.update_tol)
        if self.stream_noise is not None:
            return (f"loss rel diff {self.loss_rel_diff:.2e} > {self.tol:.2e} (= {STREAM_FACTOR:g} x the "
                    f"reference's own random-stream deviation {self.stream_noise:.2e} + {STREAM_FLOOR:g})")
        return f"max diff {self.max_abs_diff:.2e} > tol {self.tol:.0e}"


#: a formulation that keeps fp32 (chunked cross-entropy, another LSTM kernel, the clip folded
#: into the learning rate) sums in another order: a few ulps per step
FORMULATION_TOL = 1e-5


def changes_random_stream(strategy: Strategy, base: Formulation | None = None) -> bool:
    """Whether ``strategy`` draws other random numbers than the reference computing with ``base``
    (a :class:`ParityCase`'s formulation; default the plain one): ``RANDOM_STREAM_FIELDS``."""
    plain, base = Formulation(), base or Formulation()
    return any(getattr(strategy, f) != getattr(plain, f) and getattr(strategy, f) != getattr(base, f)
               for f in RANDOM_STREAM_FIELDS)


def default_tolerance(strategy: Strategy, device: torch.device | str = "cpu") -> float:
    """The relative tolerance :func:`check_parity` uses when ``tol`` is None: that of the
    strategy's rounding (a random-stream field is judged by its own rule, see the module doc)."""
    strategy = strategy.replace(**{f: getattr(Formulation(), f) for f in RANDOM_STREAM_FIELDS})
    if strategy.precision != "fp32" or strategy.formulation.bf16_gemms:
        return 3e-2
    if strategy.formulation.changed() or strategy.clip_via_lr:   # same math, other fp32 rounding
        return FORMULATION_TOL
    if strategy.backend == "inductor" or strategy.channels_last or strategy.cudnn_benchmark:
        return 1e-4         # re-fused arithmetic, or other convolution kernels: other fp32 rounding
    if strategy.fast_math and strategy.graph_passes:
        return 1e-5
    if strategy.fused_optimizer and (strategy.fused_kernel or torch.device(device).type == "cuda"):
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


#: seeds of torch's generator right after each ``build()``: stream A (the reference, and the
#: strategy when it draws the same numbers), B (the reference again), C (a random-stream strategy)
STREAM_SEEDS = (0, 1, 2)
#: random-stream rule: losses within STREAM_FACTOR x the reference's A-to-B deviation + STREAM_FLOOR
STREAM_FACTOR = 4.0
STREAM_FLOOR = 1e-4
#: random-stream rule: update size and cosine against A's within this of B's (fp32; reduced
#: precision adds its own update slack, :func:`update_tolerance`)
STREAM_MARGIN = 0.1


def _trained(build: Callable[[], Any], strategy: Strategy, steps: int, seed: int
             ) -> tuple[ParityCase, list[torch.Tensor], list[float], list[torch.Tensor], Any]:
    """A fresh case trained ``steps`` steps from torch's generator seeded ``seed`` after ``build()``
    (the caller's random streams are left as they were): (case, initial, losses, final, step)."""
    case = _as_case(build())
    device = next(case.model.parameters()).device
    initial = [p.detach().clone() for p in case.model.parameters()]
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        losses, params, step = run_steps(case, strategy, steps)
    return case, initial, losses, params, step


def _stream_tolerance(strategy: Strategy, alt: UpdateComparison) -> UpdateTolerance:
    """The update bounds of the random-stream rule: B's deviation from A plus the margin."""
    margin = STREAM_MARGIN + max(0.0, update_tolerance(strategy).scale - update_tolerance(REFERENCE).scale)
    return UpdateTolerance(abs(alt.scale - 1.0) + margin, alt.cosine - margin)


def _random_stream_parity(build: Callable[[], Any], strategy: Strategy, steps: int, tol: float,
                          ref: tuple[ParityCase, list[torch.Tensor], list[float], list[torch.Tensor], Any]
                          ) -> ParityResult:
    """The rule for a strategy that draws other random numbers (see the module doc)."""
    _, initial_a, losses_a, params_a, _ = ref
    _, initial_b, losses_b, params_b, _ = _trained(build, REFERENCE, steps, STREAM_SEEDS[1])
    _, initial, losses, params, step = _trained(build, strategy, steps, STREAM_SEEDS[2])
    noise = _rel_diff(torch.tensor(losses_b), torch.tensor(losses_a))[1]
    abs_max, rel_max = _rel_diff(torch.tensor(losses), torch.tensor(losses_a))
    allowed = STREAM_FACTOR * noise + STREAM_FLOOR + tol
    alt = compare_updates(initial_b, params_b, initial_a, params_a)
    update = compare_updates(initial, params, initial_a, params_a)
    update_tol = _stream_tolerance(strategy, alt)
    ok = rel_max <= allowed and update.within(update_tol)
    return ParityResult(ok, abs_max, losses_a, losses, allowed, getattr(step, "fallback_reason", None),
                        list(getattr(step, "report", [])), update, update_tol, losses_b, noise, alt, rel_max)


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
    Both runs start from torch's generator seeded ``STREAM_SEEDS[0]``. A strategy that draws
    other random numbers (:func:`changes_random_stream`) is judged by the random-stream rule
    (the module doc), ``tol`` then being the tolerance of its rounding, added to that rule's bound.
    """
    ref = _trained(build, REFERENCE, steps, STREAM_SEEDS[0])
    ref_case, initial_ref, losses_ref, params_ref, _ = ref
    device = next(ref_case.model.parameters()).device
    tol = default_tolerance(strategy, device) if tol is None else tol
    if changes_random_stream(strategy, ref_case.formulation):
        return _random_stream_parity(build, strategy, steps, tol, ref)
    compare_params = tol == 0 if compare_params is None else compare_params
    update_tol = update_tolerance(strategy) if update_tol is None else update_tol
    _, initial, losses, params, step = _trained(build, strategy, steps, STREAM_SEEDS[0])
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
                        update, update_tol if tol > 0 else None, loss_rel_diff=rel_max)
