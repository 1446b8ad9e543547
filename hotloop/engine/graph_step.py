"""``backend="graph"``: the step runs as captured joint graphs on hotloop's executors.

Per micro-batch the step looks up the graph captured for its
:func:`~hotloop.engine.capture.step_signature` (capturing on a miss), runs it
with the serial or parallel executor, sums the returned gradients into
``param.grad`` and then clips / updates exactly like the eager step. A
signature whose capture fails runs eagerly, and the reason is kept in
``fallback_reason`` and ``report``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..optim import sparse_gradient_modules
from ..problems.base import Batch
from .capture import (CapturedGraph, CaptureError, Signature, capture_joint, flatten_state,
                      step_signature, unflatten_state)
from .executors import ExecutorError, ParallelExecutor, SerialExecutor, make_executor
from .passes import selected_passes
from .step import StepResult, TrainStep

__all__ = ["GraphTrainStep", "CacheEntry"]


@dataclass
class CacheEntry:
    captured: CapturedGraph | None
    executor: SerialExecutor | ParallelExecutor | None
    reason: str | None = None         # why this signature runs eagerly
    runs: int = 0


class GraphTrainStep(TrainStep):
    """Whole-step capture with a per-signature graph cache; eager fallback with reasons."""

    def __init__(self, model: nn.Module, loss_fn: Any, optimizer: torch.optim.Optimizer, strategy: Any,
                 **kwargs: Any) -> None:
        super().__init__(model, loss_fn, optimizer, strategy, **kwargs)
        self.cache: dict[Signature, CacheEntry] = {}
        self.captures = 0
        self.passes = selected_passes(strategy.graph_passes, strategy.inplace, strategy.disabled_passes,
                                      strategy.fast_math)
        self.num_threads = strategy.inter_op_threads or 2
        self.static_reason = self._static_reason()
        if self.static_reason:
            self._fall_back(self.static_reason)

    def _static_reason(self) -> str | None:
        if self.grad_scaler is not None:
            return "fallback: grad_scaler (fp16 loss scaling) runs eagerly"
        if self.no_sync is not None or isinstance(self.model, nn.parallel.DistributedDataParallel):
            return "fallback: data parallel gradient hooks need eager autograd"
        sparse = sparse_gradient_modules(self.model)
        if sparse:
            return f"fallback: sparse gradients from {', '.join(sparse[:3])} cannot be captured"
        if not self.params:
            return "fallback: the model has no trainable parameters"
        return None

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        if reason not in self.report:
            self.report.append(reason)

    def entry(self, batch: Batch, state: Any, n: int) -> CacheEntry:
        """The cached graph for this micro-batch's signature (captures on a miss)."""
        sig = step_signature(self.model, batch, state, n > 1, self.strategy.precision)
        found = self.cache.get(sig)
        if found is not None:
            return found
        self.captures += 1
        try:
            captured = capture_joint(self.model, self.micro_loss_fn(n), batch, state,
                                     self.strategy.precision, self.passes)
            executor = make_executor(captured.gm, self.strategy.executor, self.num_threads)
            found = CacheEntry(captured, executor)
            self.report.append(f"captured graph #{self.captures}: {captured.nodes_captured} nodes, "
                               f"{len(captured.gm.graph.nodes)} after passes, "
                               f"{captured.capture_seconds:.2f}s")
        except CaptureError as exc:
            found = CacheEntry(None, None, exc.reason)
            self._fall_back(exc.reason)
        self.cache[sig] = found
        return found

    def __call__(self, micro_batches: Sequence[Batch], state: Any = None) -> StepResult:
        if self.static_reason:
            return super().__call__(micro_batches, state)
        n = len(micro_batches)
        if n == 0:
            raise ValueError("step() needs at least one micro-batch")
        entries = [self.entry(micro_batches[0], state, n)]
        if any(e.captured is None for e in entries):
            return super().__call__(micro_batches, state)
        state0 = state
        total_loss: Tensor | None = None
        stats: dict[str, Tensor] = {}
        grads: list[Tensor | None] = [None] * len(self.params)
        all_params = list(self.model.parameters())
        index_of = {id(p): i for i, p in enumerate(self.params)}
        for i, batch in enumerate(micro_batches):
            entry = entries[0] if i == 0 else self.entry(batch, state, n)
            if entry.captured is None:  # a later micro-batch has an uncapturable signature
                return super().__call__(micro_batches, state0)  # (no param.grad was touched yet)
            try:
                with self.phase("forward_backward"):
                    outs, state = self._run(entry, batch, state)
            except ExecutorError as exc:
                if entry.runs:  # a graph that already ran fine: a real error, not a capture problem
                    raise
                entry.captured, entry.executor = None, None
                entry.reason = f"fallback: captured graph failed on its first run: {exc}"[:300]
                self._fall_back(entry.reason)
                return super().__call__(micro_batches, state0)
            entry.runs += 1
            layout = entry.captured.layout
            loss, k = outs[0], len(layout.stat_keys)
            total_loss = loss if total_loss is None else total_loss + loss
            for key, v in zip(layout.stat_keys, outs[1:1 + k]):
                stats[key] = v if key not in stats else stats[key] + v
            for pi, g in zip(layout.used_grads, outs[1 + k + layout.num_state_out:]):
                j = index_of[id(all_params[pi])]
                grads[j] = g if grads[j] is None else grads[j] + g
        for p, g in zip(self.params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        assert total_loss is not None
        total_loss = self.finish_accumulation(total_loss, stats, n)
        return StepResult(total_loss, stats, state, self.finish_step())

    def _run(self, entry: CacheEntry, batch: Batch, state: Any) -> tuple[list[Any], Any]:
        assert entry.captured is not None and entry.executor is not None
        layout = entry.captured.layout
        try:
            leaves = flatten_state(state)[0]
        except CaptureError as exc:
            raise TypeError(exc.reason) from None
        inputs = (list(self.model.parameters()) + list(self.model.buffers())
                  + [batch[k] for k in layout.batch_keys] + leaves)
        outs = entry.executor.run(inputs)
        k = len(layout.stat_keys)
        new_state = unflatten_state(outs[1 + k:1 + k + layout.num_state_out], layout.out_state_spec)
        return outs, new_state

    def captured_graphs(self) -> list[CapturedGraph]:
        return [e.captured for e in self.cache.values() if e.captured is not None]
