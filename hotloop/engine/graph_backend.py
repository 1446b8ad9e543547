"""``backend="graph"``: each micro-batch runs as a captured joint graph on hotloop's executors.

Per micro-batch the backend looks up the graph captured for its
:func:`~hotloop.engine.capture.step_signature` (capturing on a miss), runs it
with the serial or parallel executor and sums the returned gradients into
``param.grad``; the step then clips and updates as for every backend. A
signature whose capture fails runs eagerly, and the reason is kept in
``fallback_reason`` and the step's report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..optim import sparse_gradient_modules
from ..problems.base import Batch
from .backends import EagerBackend, ForwardBackward
from .capture import (CapturedGraph, CaptureError, Signature, capture_joint, flatten_state,
                      step_signature, unflatten_state)
from .executors import ExecutorError, ParallelExecutor, SerialExecutor, make_executor
from .passes import selected_passes
from .precision import Precision
from .step_parts import LossFn, PhaseHook

__all__ = ["GraphBackend", "CacheEntry"]


@dataclass
class CacheEntry:
    captured: CapturedGraph | None
    executor: SerialExecutor | ParallelExecutor | None
    reason: str | None = None         # why this signature runs eagerly
    runs: int = 0


class GraphBackend(EagerBackend):
    """Whole-micro-batch capture with a per-signature graph cache; eager fallback with reasons."""

    name = "graph"

    def __init__(self, model: nn.Module, strategy: Any, precision: Precision, *, data_parallel: bool,
                 report: list[str] | None = None) -> None:
        super().__init__(report)
        self.cache: dict[Signature, CacheEntry] = {}
        self.captures = 0
        self.passes = selected_passes(strategy.graph_passes, strategy.inplace, strategy.disabled_passes,
                                      strategy.fast_math)
        self.executor_kind = strategy.executor
        self.num_threads = strategy.inter_op_threads or 2
        self.static_reason = self._static_reason(model, precision, data_parallel)
        if self.static_reason:
            self.fall_back(self.static_reason)

    @staticmethod
    def _static_reason(model: nn.Module, precision: Precision, data_parallel: bool) -> str | None:
        if precision.scales_loss:
            return "fallback: grad_scaler (fp16 loss scaling) runs eagerly"
        if data_parallel or isinstance(model, nn.parallel.DistributedDataParallel):
            return "fallback: data parallel gradient hooks need eager autograd"
        sparse = sparse_gradient_modules(model)
        if sparse:
            return f"fallback: sparse gradients from {', '.join(sparse[:3])} cannot be captured"
        if not any(p.requires_grad for p in model.parameters()):
            return "fallback: the model has no trainable parameters"
        return None

    def entry(self, model: nn.Module, loss_fn: LossFn, batch: Batch, state: Any, weighted: bool,
              precision: Precision) -> CacheEntry:
        """The cached graph for this micro-batch's signature (captures on a miss)."""
        sig = step_signature(model, batch, state, weighted, precision.name)
        found = self.cache.get(sig)
        if found is not None:
            return found
        self.captures += 1
        try:
            captured = capture_joint(model, loss_fn, batch, state, precision, self.passes)
            executor = make_executor(captured.gm, self.executor_kind, self.num_threads)
            found = CacheEntry(captured, executor)
            self.report.append(f"captured graph #{self.captures}: {captured.nodes_captured} nodes, "
                               f"{len(captured.gm.graph.nodes)} after passes, "
                               f"{captured.capture_seconds:.2f}s")
        except CaptureError as exc:
            found = CacheEntry(None, None, exc.reason)
            self.fall_back(exc.reason)
        self.cache[sig] = found
        return found

    def forward_backward(self, model: nn.Module, loss_fn: LossFn, batch: Batch, state: Any, weighted: bool,
                         precision: Precision, phase: PhaseHook) -> ForwardBackward:
        if self.static_reason:
            return super().forward_backward(model, loss_fn, batch, state, weighted, precision, phase)
        entry = self.entry(model, loss_fn, batch, state, weighted, precision)
        if entry.captured is None:           # this signature cannot be captured: it runs eagerly
            return super().forward_backward(model, loss_fn, batch, state, weighted, precision, phase)
        params = list(model.parameters())
        try:
            with phase("forward_backward"):
                outs, new_state = self._run(model, params, entry, batch, state)
        except ExecutorError as exc:
            if entry.runs:   # a graph that already ran fine: a real error, not a capture problem
                raise
            entry.captured, entry.executor = None, None
            entry.reason = f"fallback: captured graph failed on its first run: {exc}"[:300]
            self.fall_back(entry.reason)   # nothing was summed into param.grad yet
            return super().forward_backward(model, loss_fn, batch, state, weighted, precision, phase)
        entry.runs += 1
        layout = entry.captured.layout
        k = len(layout.stat_keys)
        stats = dict(zip(layout.stat_keys, outs[1:1 + k]))
        for pi, g in zip(layout.used_grads, outs[1 + k + layout.num_state_out:]):
            param = params[pi]
            param.grad = g if param.grad is None else param.grad + g
        return outs[0], stats, new_state

    @staticmethod
    def _run(model: nn.Module, params: list[nn.Parameter], entry: CacheEntry, batch: Batch, state: Any
             ) -> tuple[list[Any], Any]:
        assert entry.captured is not None and entry.executor is not None
        layout = entry.captured.layout
        try:
            leaves = flatten_state(state)[0]
        except CaptureError as exc:
            raise TypeError(exc.reason) from None
        inputs = (params + list(model.buffers())
                  + [batch[k] for k in layout.batch_keys] + leaves)
        outs = entry.executor.run(inputs)
        k = len(layout.stat_keys)
        new_state = unflatten_state(outs[1 + k:1 + k + layout.num_state_out], layout.out_state_spec)
        return outs, new_state

    def captured_graphs(self) -> list[CapturedGraph]:
        return [e.captured for e in self.cache.values() if e.captured is not None]
