"""Teacher-forced evaluation of a model over one reader (no optimizer needed)."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..data.prefetch import to_device
from ..engine.precision import Precision
from ..engine.step_parts import detach_state
from ..registry import evaluators
from .metrics import StatsAccumulator, summarize

__all__ = ["evaluate_reader"]


@torch.no_grad()
def evaluate_reader(model: nn.Module, reader: Any, *, device: torch.device, precision: str = "fp32",
                    initial_state: Any = None, max_batches: int = 0,
                    reduce: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None
                    ) -> dict[str, float]:
    """Loss, ppl, accuracy and seq_accuracy of ``model`` over one pass of ``reader``.

    A task with its own evaluator (:data:`hotloop.registry.evaluators`, e.g. ``detect``: losses
    plus COCO AP) is scored by it instead.

    ``initial_state`` is the carried state for streamed problems (None otherwise);
    ``max_batches`` > 0 limits the pass; ``reduce`` sums statistics over ranks.
    One host sync at the end.
    """
    task = getattr(getattr(model, "spec", None), "task", None)
    if task is not None and task in evaluators:
        return evaluators.get(task)(model, reader, device=device, max_batches=max_batches)
    was_training = model.training
    model.eval()
    acc = StatsAccumulator()
    state = initial_state
    try:
        with Precision(precision, device).autocast():
            for i, batch in enumerate(reader):
                if max_batches and i >= max_batches:
                    break
                out = model.loss(to_device(batch, device), state, with_accuracy=True)
                state = detach_state(out.state)
                acc.add(out.stats)
    finally:
        model.train(was_training)
    return summarize(acc.read(reduce))
