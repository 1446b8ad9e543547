"""What the step and its backends share: the result, loss functions, phases, carried state."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor, nn

from ..models.base import LossOutput
from ..problems.base import Batch

__all__ = ["StepResult", "LossFn", "PhaseHook", "Phase", "ACCUM_WEIGHT", "detach_state", "default_loss_fn",
           "training_loss_fn",
           "weighted_loss_fn", "no_phase"]

LossFn = Callable[[nn.Module, Batch, Any], LossOutput]
#: ``hook(phase) -> context manager`` around each phase of a step ("forward", "backward",
#: "forward_backward" for captured graphs, "optimizer"); the profiler times and annotates with it
PhaseHook = Callable[[str], contextlib.AbstractContextManager]
#: the statistic that carries a micro-batch's accumulation weight through every backend
ACCUM_WEIGHT = "_accum_weight"


@dataclass
class StepResult:
    loss: Tensor                 # detached mean loss over the micro-batches
    stats: dict[str, Tensor]     # summed statistics (no host sync)
    state: Any                   # carried model state, detached
    grad_norm: Tensor | None     # pre-clip global grad norm when clipping


@dataclass(frozen=True)
class Phase:
    """One (loss, optimizer) phase of a step: its name, loss and the parameters its optimizer updates.

    A one-loss model has one phase; a GAN has one per network (:func:`~hotloop.engine.program.model_phases`).
    """

    name: str
    loss_fn: LossFn
    parameters: tuple[nn.Parameter, ...]


def detach_state(state: Any) -> Any:
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, (tuple, list)):
        return type(state)(detach_state(s) for s in state)
    if isinstance(state, dict):
        return {k: detach_state(v) for k, v in state.items()}
    return state


def default_loss_fn(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
    return model.loss(batch, state)  # type: ignore[operator]


def no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def training_loss_fn(loss_fn: LossFn) -> LossFn:
    """``loss_fn`` as a training step runs it: without the model's logits.

    A step returns only the loss, the statistics and the carried state, so the logits (for a
    language model ``[tokens, vocab]``, the largest activation) need not outlive the forward:
    autograd keeps what backward needs, and backward's own buffers can reuse their memory.
    A compiled step need not return them either.
    """
    def training(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
        out = loss_fn(model, batch, state)
        return LossOutput(out.loss, out.stats, out.state, None, out.weight)
    return training


def weighted_loss_fn(loss_fn: LossFn) -> LossFn:
    """``loss_fn`` for one micro-batch of an accumulated step: the mean loss times its weight.

    The weight is ``LossOutput.weight`` (what the mean is over, e.g. non-pad tokens), or 1
    when the model gives none; it travels as the statistic :data:`ACCUM_WEIGHT` so every
    backend (eager, captured graph, inductor) returns it. The step divides the summed
    gradients by the summed weights, so k micro-batches give the gradient of one batch
    of their concatenation.
    """
    def weighted(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
        out = loss_fn(model, batch, state)
        weight = out.weight if out.weight is not None else out.loss.new_ones(())
        stats = dict(out.stats)
        stats[ACCUM_WEIGHT] = weight
        return LossOutput(out.loss * weight, stats, out.state, None, weight)     # no logits: as training_loss_fn
    return weighted
