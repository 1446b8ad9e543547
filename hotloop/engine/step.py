"""The training step: one callable for every backend and every model.

``step(micro_batches, state) -> StepResult`` runs each phase of the step (one for
a one-loss model; a GAN has one per network): the micro-batch loop with
accumulation weights, then the clip and the update of that phase's optimizer.
How one micro-batch's forward and backward run is the backend's part
(:mod:`hotloop.engine.backends`: eager, captured graph, inductor); autocast and
loss scaling are the :class:`~hotloop.engine.precision.Precision`'s. A step never
reads a value back to the host: the loss and statistics stay tensors, so the
trainer decides when to synchronise (``Strategy.sync_every``).

:func:`hotloop.engine.build.build_step` builds it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..problems.base import Batch
from .backends import Backend, EagerBackend
from .clipping import clip_grad_norm, clip_via_lr, clip_via_lr_unavailable
from .precision import Precision
from .storage_order import in_storage_order
from .step_parts import (ACCUM_WEIGHT, LossFn, Phase, PhaseHook, StepResult, detach_state, no_phase,
                         training_loss_fn, weighted_loss_fn)

__all__ = ["TrainStep", "one_phase"]


class TrainStep:
    """The whole step: ``step(micro_batches, state) -> StepResult``.

    Gradient accumulation: pass several micro-batches; each micro-loss is weighted by
    what its mean is over (:func:`~hotloop.engine.step_parts.weighted_loss_fn`) and the
    summed gradients are divided by the total weight, on the device (no host sync).
    ``phase`` (a :data:`~hotloop.engine.step_parts.PhaseHook`) wraps each part of the
    step; the default does nothing. ``optimizer`` is what the Trainer sees (a
    :class:`~hotloop.engine.program.PhaseOptimizers` for several phases);
    ``phase_optimizers[i]`` steps phase ``i``'s parameters. ``inputs`` (the channels-last
    conversion) makes each micro-batch what the model reads, once per step before any phase:
    every phase of a step sees the same batch tensors (CycleGAN's discriminator phase finds the
    fakes its generator phase made from them).
    """

    def __init__(self, model: nn.Module, phases: Sequence[Phase], optimizer: Any,
                 phase_optimizers: Sequence[torch.optim.Optimizer], precision: Precision, *,
                 backend: Backend | None = None, max_grad_norm: float = 0.0,
                 no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                 clip_via_lr: bool = False, report: list[str] | None = None,
                 inputs: Callable[[Batch], Batch] | None = None) -> None:
        if not phases or len(phases) != len(phase_optimizers):
            raise ValueError("a step needs one optimizer per phase (and at least one phase)")
        self.model = model
        self.phases = list(phases)
        self.optimizer = optimizer
        self.phase_optimizers = list(phase_optimizers)
        self.precision = precision
        self.report: list[str] = report if report is not None else []
        self.notices: list[str] = []       # what the user must be told (the Trainer shows these)
        self.backend = backend if backend is not None else EagerBackend(self.report)
        self.max_grad_norm = max_grad_norm
        self.no_sync = no_sync
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.phase: PhaseHook = no_phase
        self.inputs = inputs
        # one loss function object per (phase, weighted): a compiling backend caches by identity
        self._loss_fns = [(training_loss_fn(p.loss_fn), weighted_loss_fn(p.loss_fn)) for p in self.phases]
        self.clip_via_lr = self._fold_clip(clip_via_lr)

    @property
    def fallback_reason(self) -> str | None:
        """Why (some) micro-batches run eagerly although the Strategy asked for another backend."""
        return self.backend.fallback_reason

    @property
    def captures(self) -> int:
        """Graphs captured so far (``backend="graph"``; 0 otherwise)."""
        return getattr(self.backend, "captures", 0)

    def captured_graphs(self) -> list[Any]:
        captured = getattr(self.backend, "captured_graphs", None)
        return captured() if callable(captured) else []

    def _fold_clip(self, wanted: bool) -> bool:
        """Whether the clip factor folds into every phase's SGD learning rate (report says why not)."""
        if not wanted:
            return False
        if self.max_grad_norm <= 0:
            self.report.append("clip: not folded into the learning rate (max_grad_norm=0: no clipping)")
            return False
        reasons = ["the loss is scaled (fp16)"] if self.precision.scales_loss else []
        reasons += [r for r in (clip_via_lr_unavailable(opt, self.device) for opt in self.phase_optimizers) if r]
        self.report.append("clip: folded into the SGD learning rate" if not reasons
                           else f"clip: not folded into the learning rate ({reasons[0]})")
        return not reasons

    def __call__(self, micro_batches: Sequence[Batch], state: Any = None) -> StepResult:
        if not micro_batches:
            raise ValueError("step() needs at least one micro-batch")
        if self.inputs is not None:
            micro_batches = [self.inputs(batch) for batch in micro_batches]
        if len(self.phases) == 1:
            loss, norm, stats, state = self._run_phase(0, micro_batches, state)
            self.precision.update()
            return StepResult(loss, stats, state, norm)
        first: tuple[Tensor, Tensor | None] | None = None
        stats: dict[str, Tensor] = {}
        for index, phase in enumerate(self.phases):
            for p in self.params:                    # a phase sees only its own gradients
                p.grad = None
            loss, norm, phase_stats, _ = self._run_phase(index, micro_batches, state)
            first = first or (loss, norm)
            prefix = "" if index == 0 else f"{phase.name}/"
            stats.update({prefix + key: value for key, value in phase_stats.items()})
        self.precision.update()                      # once per step, after every optimizer stepped
        assert first is not None
        return StepResult(first[0], stats, detach_state(state), first[1])

    def _hook(self, index: int) -> PhaseHook:
        if len(self.phases) == 1:
            return self.phase
        name = self.phases[index].name
        return lambda part: self.phase(f"{name}_{part}")

    def _run_phase(self, index: int, micro_batches: Sequence[Batch], state: Any
                   ) -> tuple[Tensor, Tensor | None, dict[str, Tensor], Any]:
        """Phase ``index``: forward/backward over the micro-batches, then its clip and update."""
        n = len(micro_batches)
        loss_fn = self._loss_fns[index][n > 1]
        hook = self._hook(index)
        total: Tensor | None = None
        stats: dict[str, Tensor] = {}
        for i, batch in enumerate(micro_batches):
            sync = self.no_sync() if (self.no_sync is not None and i < n - 1) else contextlib.nullcontext()
            with sync:
                loss, batch_stats, state = self.backend.forward_backward(
                    self.model, loss_fn, batch, state, n > 1, self.precision, hook)
            total = loss if total is None else total + loss
            for k, v in batch_stats.items():
                stats[k] = v if k not in stats else stats[k] + v
        assert total is not None
        total = self.finish_accumulation(total, stats, n)
        with hook("optimizer"):
            norm = self.clip_and_update(self.phase_optimizers[index], self.phases[index].parameters)
        return total, norm, stats, state

    def finish_accumulation(self, total_loss: Tensor, stats: dict[str, Tensor], n: int) -> Tensor:
        """After ``n > 1`` weighted micro-batches: divide the gradients and the loss by the total
        weight (popped from ``stats``); returns the step's mean loss. Identity for ``n == 1``."""
        if n == 1:
            return total_loss
        weight = stats.pop(ACCUM_WEIGHT).to(total_loss.dtype).clamp(min=1)   # [] on the device
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_div_(grads, weight)
        return total_loss / weight

    def clip_and_update(self, optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]) -> Tensor | None:
        """Clip ``params``' gradients (unscaled first), step ``optimizer`` and release the
        gradients; returns the pre-clip norm when clipping."""
        if self.clip_via_lr:
            with in_storage_order(optimizer):
                grad_norm = clip_via_lr(optimizer, list(params), self.max_grad_norm)
            optimizer.zero_grad(set_to_none=True)
            return grad_norm
        grad_norm = None
        if self.max_grad_norm > 0:
            self.precision.unscale(optimizer)
            grad_norm = clip_grad_norm(list(params), self.max_grad_norm)
        with in_storage_order(optimizer):       # a fused update of channels_last weights, uncopied
            self.precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return grad_norm


def one_phase(loss_fn: LossFn, model: nn.Module) -> list[Phase]:
    """The single phase of a one-loss model: ``loss_fn`` over every trainable parameter."""
    return [Phase("loss", loss_fn, tuple(p for p in model.parameters() if p.requires_grad))]

