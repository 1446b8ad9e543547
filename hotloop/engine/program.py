"""Step programs: several (loss, optimizer) phases in one training step (GANs and the like).

A model trains in phases when it has ``parameter_groups() -> {phase: [params]}``
(in phase order) and a ``<phase>_loss(batch) -> LossOutput`` method per phase, e.g.
CycleGAN's ``generator`` then ``discriminator``. Each phase clears every gradient,
runs its loss forward and backward (weighted accumulation over micro-batches, as the
single-loss step), clips its own parameters and steps its own optimizer.

The optimizers are held by one :class:`PhaseOptimizers`, which looks like one
optimizer to the Trainer: ``param_groups`` (the LR schedule sets every phase's rate),
``state_dict`` / ``load_state_dict`` (checkpoints and bitwise resume cover every phase).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..models.base import LossOutput
from ..problems.base import Batch
from .step import StepResult, TrainStep, autocast_context, clip_grad_norm, detach_state, weighted_loss_fn
from .strategy import Strategy

__all__ = ["Phase", "PhaseOptimizers", "ProgramStep", "model_phases"]


@dataclass(frozen=True)
class Phase:
    """One phase of a step: its name, loss and the parameters its optimizer updates."""

    name: str
    loss_fn: Callable[[nn.Module, Batch, Any], LossOutput]
    parameters: tuple[nn.Parameter, ...]


def model_phases(model: nn.Module) -> list[Phase] | None:
    """The model's phases (``parameter_groups()`` + ``<name>_loss``), or None for a one-loss model."""
    groups = getattr(model, "parameter_groups", None)
    if not callable(groups):
        return None
    phases = []
    for name, params in groups().items():
        method = getattr(model, f"{name}_loss", None)
        if not callable(method):
            raise TypeError(f"{type(model).__name__}.parameter_groups() names phase {name!r} "
                            f"but the model has no {name}_loss(batch) method")
        phases.append(Phase(name, lambda m, b, s, _n=name: getattr(m, f"{_n}_loss")(b),
                            tuple(p for p in params if p.requires_grad)))
    return phases


class PhaseOptimizers:
    """One optimizer per phase, seen by the Trainer as one optimizer."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        self.optimizers = dict(optimizers)

    def __getitem__(self, name: str) -> torch.optim.Optimizer:
        return self.optimizers[name]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"phases": {name: opt.state_dict() for name, opt in self.optimizers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        phases = state.get("phases") if isinstance(state, dict) else None
        if not isinstance(phases, dict) or set(phases) != set(self.optimizers):
            raise ValueError(f"optimizer state has phases {sorted(phases or {})}, this step has "
                             f"{sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(phases[name])

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)


class ProgramStep(TrainStep):
    """The eager step of a phased model: ``step(micro_batches, state) -> StepResult``.

    The result's ``loss`` and ``grad_norm`` are the first phase's; statistics of later
    phases are prefixed with ``<phase>/`` so that they sum without mixing.
    """

    def __init__(self, model: nn.Module, phases: Sequence[Phase], optimizer: PhaseOptimizers,
                 strategy: Strategy, *, max_grad_norm: float = 0.0, **kwargs: Any) -> None:
        super().__init__(model, phases[0].loss_fn, optimizer, strategy, max_grad_norm=max_grad_norm, **kwargs)
        self.phases = list(phases)
        self.all_params = [p for p in model.parameters() if p.requires_grad]
        if strategy.backend != "eager":
            self.fallback_reason = f"fallback: a step of {len(phases)} phases runs eagerly (backend={strategy.backend})"
            self.report.append(self.fallback_reason)

    def __call__(self, micro_batches: Sequence[Batch], state: Any = None) -> StepResult:
        n = len(micro_batches)
        if n == 0:
            raise ValueError("step() needs at least one micro-batch")
        first: tuple[Tensor, Tensor | None] | None = None
        stats: dict[str, Tensor] = {}
        for index, phase in enumerate(self.phases):
            loss, grad_norm, phase_stats = self._run_phase(phase, micro_batches, state)
            if first is None:
                first = (loss, grad_norm)
            prefix = "" if index == 0 else f"{phase.name}/"
            for key, value in phase_stats.items():
                stats[prefix + key] = value
        assert first is not None
        return StepResult(first[0], stats, detach_state(state), first[1])

    def _run_phase(self, phase: Phase, micro_batches: Sequence[Batch], state: Any
                   ) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
        n = len(micro_batches)
        loss_fn = phase.loss_fn if n == 1 else weighted_loss_fn(phase.loss_fn)
        for p in self.all_params:                 # a phase sees only its own gradients
            p.grad = None
        total: Tensor | None = None
        stats: dict[str, Tensor] = {}
        for batch in micro_batches:
            with self.phase(f"{phase.name}_forward"), autocast_context(self.strategy.precision, self.device):
                out = loss_fn(self.model, batch, state)
            with self.phase(f"{phase.name}_backward"):
                (self.grad_scaler.scale(out.loss) if self.grad_scaler is not None else out.loss).backward()
            total = out.loss.detach() if total is None else total + out.loss.detach()
            for k, v in out.stats.items():
                stats[k] = v if k not in stats else stats[k] + v
        assert total is not None
        params = list(phase.parameters)
        total = self.finish_accumulation(total, stats, n)   # other phases' stray grads are cleared next phase
        optimizer = self.optimizer[phase.name]    # type: ignore[index]
        with self.phase(f"{phase.name}_optimizer"):
            grad_norm = None
            if self.max_grad_norm > 0:
                if self.grad_scaler is not None:
                    self.grad_scaler.unscale_(optimizer)
                grad_norm = clip_grad_norm(params, self.max_grad_norm)
            if self.grad_scaler is not None:
                self.grad_scaler.step(optimizer)
                self.grad_scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return total, grad_norm, stats

