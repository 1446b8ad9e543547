"""Step programs: several (loss, optimizer) phases in one training step (GANs and the like).

A model trains in phases when it has ``parameter_groups() -> {phase: [params]}``
(in phase order) and a ``<phase>_loss(batch) -> LossOutput`` method per phase, e.g.
CycleGAN's ``generator`` then ``discriminator``. The one
:class:`~hotloop.engine.step.TrainStep` runs them: each phase clears every gradient,
runs its loss forward and backward (weighted accumulation over micro-batches, as a
one-loss step), clips its own parameters and steps its own optimizer; the loss scale
is updated once per step.

The optimizers are held by one :class:`PhaseOptimizers`, which looks like one
optimizer to the Trainer: ``param_groups`` (the LR schedule sets every phase's rate),
``state_dict`` / ``load_state_dict`` (checkpoints and bitwise resume cover every phase).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .step_parts import Phase

__all__ = ["Phase", "PhaseOptimizers", "model_phases"]


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
