"""Freezing the body for the first steps of a fine-tuning run (``hp.freeze_body_steps``).

The body is every parameter outside the model's ``head_prefixes`` (BERT: everything but the
classifier, or but the MLM and NSP heads). While frozen, body parameters have
``requires_grad=False``: the backward pass computes no gradient for them, so the optimizer
neither moves them nor changes their state (step counts, moments). They are unfrozen after
step ``freeze_body_steps``; a resumed run freezes again when it resumes before that step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from .events import Callback, Event
from .setup import TrainerError

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["FreezeBody", "body_parameters", "freeze_callbacks"]


def body_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters outside ``model.head_prefixes``; an error when the model declares no head."""
    heads = tuple(getattr(model, "head_prefixes", ()) or ())
    if not heads:
        raise TrainerError(f"freeze_body_steps: model {type(model).__name__} declares no head "
                           f"(head_prefixes), so its body is not known; use freeze_body_steps=0")
    return [p for name, p in model.named_parameters() if not name.startswith(heads)]


class FreezeBody(Callback):
    """Body parameters get ``requires_grad=False`` until ``steps`` optimizer steps are done."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._frozen: list[nn.Parameter] = []

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START and trainer.step < self.steps:
            if trainer.dist.world_size > 1:
                raise TrainerError("freeze_body_steps needs a one-process run (data-parallel replicas "
                                   "cannot change which parameters have gradients)")
            self._frozen = [p for p in body_parameters(trainer.model) if p.requires_grad]
            for p in self._frozen:
                p.requires_grad_(False)
            trainer.notify(f"freeze: {len(self._frozen)} body parameters frozen until step {self.steps}")
        elif self._frozen and (event is Event.FIT_END or (event is Event.STEP_END and info["step"] >= self.steps)):
            for p in self._frozen:
                p.requires_grad_(True)
            if event is Event.STEP_END:
                trainer.notify(f"freeze: body unfrozen after step {info['step']}")
            self._frozen = []


def freeze_callbacks(hp: Any) -> list[Callback]:
    """``[FreezeBody(hp.freeze_body_steps)]`` when it is set, else []."""
    steps = int(getattr(hp, "freeze_body_steps", 0) or 0)
    if steps < 0:
        raise TrainerError(f"freeze_body_steps must be >= 0, got {steps}")
    return [FreezeBody(steps)] if steps else []
