"""What differs between step backends: how one micro-batch's forward and backward run.

A backend's ``forward_backward(model, loss_fn, batch, state, weighted, precision, phase)``
runs ``loss_fn`` on one micro-batch and leaves its gradients summed into
``param.grad``; it returns ``(detached loss, statistics, detached carried state)``.
The micro-batch loop, weighting, clipping, loss scaling and the update belong to
:class:`~hotloop.engine.step.TrainStep`, the same for every backend. A backend that
cannot run a micro-batch its own way runs it eagerly and says why in
``fallback_reason`` (and the step's report).
"""
from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor, nn

from ..models.base import LossOutput
from ..problems.base import Batch
from .precision import Precision
from .step_parts import LossFn, PhaseHook, detach_state

__all__ = ["Backend", "EagerBackend", "ForwardBackward"]

#: what ``forward_backward`` returns: (detached loss, statistics, detached carried state)
ForwardBackward = tuple[Tensor, dict[str, Tensor], Any]


class Backend(Protocol):
    """How one micro-batch's forward and backward run (see the module doc)."""

    name: str
    fallback_reason: str | None

    def forward_backward(self, model: nn.Module, loss_fn: LossFn, batch: Batch, state: Any, weighted: bool,
                         precision: Precision, phase: PhaseHook) -> ForwardBackward: ...


class EagerBackend:
    """Autograd as written: the loss under the precision's autocast, then its (scaled) backward."""

    name = "eager"

    def __init__(self, report: list[str] | None = None) -> None:
        self.report = report if report is not None else []
        self.fallback_reason: str | None = None

    def fall_back(self, reason: str) -> None:
        """Record why this backend runs (some) micro-batches eagerly."""
        self.fallback_reason = reason
        if reason not in self.report:
            self.report.append(reason)

    def forward_backward(self, model: nn.Module, loss_fn: LossFn, batch: Batch, state: Any, weighted: bool,
                         precision: Precision, phase: PhaseHook) -> ForwardBackward:
        return self.backward(self.forward(model, loss_fn, batch, state, precision, phase), precision, phase)

    @staticmethod
    def forward(model: nn.Module, loss_fn: LossFn, batch: Batch, state: Any, precision: Precision,
                phase: PhaseHook) -> LossOutput:
        """``loss_fn`` on one micro-batch under the precision's autocast."""
        with phase("forward"), precision.autocast():
            return loss_fn(model, batch, state)

    @staticmethod
    def backward(out: LossOutput, precision: Precision, phase: PhaseHook) -> ForwardBackward:
        """The (scaled) backward of ``out.loss``; what ``forward_backward`` returns."""
        with phase("backward"):
            precision.backward(out.loss)
        return out.loss.detach(), out.stats, detach_state(out.state)
