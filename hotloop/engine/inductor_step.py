"""``backend="inductor"``: the forward + loss is ``torch.compile``d (AOT autograd compiles the backward).

Clipping and the optimizer update stay eager (multi-tensor kernels). Graph
breaks are counted from dynamo's counters after the first call; if compiling
fails (no C++ compiler, an unsupported op) the step runs eagerly and
``fallback_reason`` says why. ``cuda_graphs=True`` selects the
``reduce-overhead`` mode (CUDA graphs).
"""
from __future__ import annotations

import shutil
from typing import Any, Sequence

import torch
from torch import nn

from ..models.base import LossOutput
from ..problems.base import Batch
from .step import StepResult, TrainStep

__all__ = ["InductorTrainStep"]


class InductorTrainStep(TrainStep):
    """Eager step whose loss function is compiled by torch.compile (inductor)."""

    def __init__(self, model: nn.Module, loss_fn: Any, optimizer: torch.optim.Optimizer, strategy: Any,
                 **kwargs: Any) -> None:
        super().__init__(model, loss_fn, optimizer, strategy, **kwargs)
        self.eager_loss_fn = loss_fn
        self.compiled = False
        self.graph_breaks = 0
        if self.device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
            self._fall_back("fallback: inductor on CPU needs a C++ compiler (none on PATH)")
            return
        mode = "reduce-overhead" if strategy.cuda_graphs else None

        def forward(m: nn.Module, batch: Batch, state: Any) -> tuple:
            out = loss_fn(m, batch, state)
            return out.loss, out.stats, out.state, out.weight

        self._compiled_fn = torch.compile(forward, mode=mode)
        self.loss_fn = self._compiled_loss

    def _compiled_loss(self, model: nn.Module, batch: Batch, state: Any) -> LossOutput:
        loss, stats, new_state, weight = self._compiled_fn(model, batch, state)
        return LossOutput(loss, stats, new_state, weight=weight)

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self.report.append(reason)
        self.loss_fn = self.eager_loss_fn

    def __call__(self, micro_batches: Sequence[Batch], state: Any = None) -> StepResult:
        if self.compiled or self.fallback_reason:
            return super().__call__(micro_batches, state)
        from torch._dynamo.utils import counters
        before = sum(counters["graph_break"].values())
        try:
            result = super().__call__(micro_batches, state)
        except Exception as exc:  # noqa: BLE001 - any compile failure falls back to eager
            self.optimizer.zero_grad(set_to_none=True)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self._fall_back(f"fallback: torch.compile failed: {type(exc).__name__}: {first[:200]}")
            return super().__call__(micro_batches, state)
        self.compiled = True
        self.graph_breaks = sum(counters["graph_break"].values()) - before
        self.report.append(f"inductor: compiled, {self.graph_breaks} graph break(s)")
        for reason, count in counters["graph_break"].items():
            self.report.append(f"graph break x{count}: {str(reason).splitlines()[0][:160]}")
        return result
