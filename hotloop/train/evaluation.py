"""Evaluation of a model over one reader (no optimizer needed).

Per batch, one of: the model's teacher-forced loss (``model.loss(batch, state, with_accuracy=True)``),
a user's ``loss_fn(model, batch, state) -> LossOutput``, or a user's ``eval_step(model, batch)``
returning outputs for the metrics. Summable statistics give loss, ppl and accuracies
(:func:`~hotloop.train.metrics.summarize`); metric objects (:class:`~hotloop.train.metrics.MetricSpec`)
read the outputs and are computed once at the end. ``should_stop(i)`` is asked before batch ``i``:
True ends the pass with :class:`EvaluationStopped` (a stop signal during a long evaluation).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import torch
from torch import Tensor, nn

from ..data.prefetch import to_device
from ..engine.precision import Precision
from ..engine.step_parts import LossFn, detach_state
from ..registry import evaluators
from .metrics import MetricSpec, StatsAccumulator, compute_metrics, reset_metrics, summarize

__all__ = ["evaluate_reader", "EvalStep", "EvaluationStopped"]

#: ``eval_step(model, batch) -> outputs``: a mapping of tensors for the metrics (a ``"loss"`` entry,
#: a mean over ``"weight"`` rows, default the batch's rows, is reported as ``loss``), or one tensor (``preds``)
EvalStep = Callable[[nn.Module, Any], Any]


class EvaluationStopped(Exception):
    """An evaluation ended early because ``should_stop`` said so (its results are discarded)."""


class _Stoppable:
    """``reader``, asking ``should_stop(i)`` before each batch ``i`` (for a task's own evaluator too)."""

    def __init__(self, reader: Any, should_stop: Callable[[int], bool]) -> None:
        self.reader, self.should_stop = reader, should_stop

    def __len__(self) -> int:
        return len(self.reader)

    def __iter__(self) -> Iterator[Any]:
        for i, batch in enumerate(self.reader):
            if self.should_stop(i):
                raise EvaluationStopped(f"stopped before batch {i}")
            yield batch


def _rows(batch: Any) -> int:
    """Rows (dim 0) of the first tensor of a batch (1 when there is none)."""
    values = batch.values() if isinstance(batch, Mapping) else [batch]
    return next((v.shape[0] for v in values if isinstance(v, Tensor) and v.ndim), 1)


def _as_outputs(result: Any) -> dict[str, Any]:
    if isinstance(result, Mapping):
        return dict(result)
    if isinstance(result, Tensor):
        return {"preds": result}
    raise TypeError(f"eval_step must return a mapping of outputs or a tensor, got {type(result).__name__}")


@torch.no_grad()
def evaluate_reader(model: nn.Module, reader: Any, *, device: torch.device, precision: str = "fp32",
                    initial_state: Any = None, max_batches: int = 0,
                    reduce: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None,
                    loss_fn: LossFn | None = None, eval_step: EvalStep | None = None,
                    metrics: dict[str, MetricSpec] | None = None,
                    should_stop: Callable[[int], bool] | None = None) -> dict[str, float]:
    """The metrics of ``model`` over one pass of ``reader`` (see the module doc).

    A task with its own evaluator (:data:`hotloop.registry.evaluators`, e.g. ``detect``: losses
    plus COCO AP) is scored by it when no ``loss_fn``, ``eval_step`` or ``metrics`` is given.
    ``initial_state`` is the carried state for streamed problems (None otherwise; ``eval_step``
    gets no state); ``max_batches`` > 0 limits the pass; ``reduce`` sums statistics over ranks
    (every rank must call this). One host sync for the statistics at the end.
    """
    metrics = metrics or {}
    if should_stop is not None:
        reader = _Stoppable(reader, should_stop)
    task = getattr(getattr(model, "spec", None), "task", None)
    if task is not None and task in evaluators and loss_fn is None and eval_step is None and not metrics:
        return evaluators.get(task)(model, reader, device=device, max_batches=max_batches)
    was_training = model.training
    model.eval()
    acc = StatsAccumulator()
    state = initial_state
    reset_metrics(metrics)
    try:
        for i, batch in enumerate(reader):
            if max_batches and i >= max_batches:
                break
            batch = to_device(batch, device)
            with Precision(precision, device).autocast():
                if eval_step is not None:
                    outputs = _as_outputs(eval_step(model, batch))
                else:
                    out = (loss_fn(model, batch, state) if loss_fn is not None
                           else model.loss(batch, state, with_accuracy=True))
                    state = detach_state(out.state)
                    acc.add(out.stats)
                    outputs = {"logits": out.logits, "loss": out.loss}
            if eval_step is not None and "loss" in outputs:
                loss = outputs["loss"].detach().to(torch.float64)                       # [] mean over rows
                rows = torch.as_tensor(outputs.get("weight", _rows(batch)), dtype=torch.float64, device=loss.device)
                acc.add({"loss_sum": loss * rows, "examples": rows})
            for spec in metrics.values():
                spec.update(outputs, batch)
    finally:
        model.train(was_training)
    result = summarize(acc.read(reduce))
    result.update(compute_metrics(metrics))
    return result
