"""Teacher-forced evaluation of a model over one reader (no optimizer needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..engine.precision import Precision
from ..engine.step_parts import detach_state
from .feeding import to_device
from .metrics import StatsAccumulator, summarize

__all__ = ["evaluate_reader", "evaluate_checkpoint"]


@torch.no_grad()
def evaluate_reader(model: nn.Module, reader: Any, *, device: torch.device, precision: str = "fp32",
                    initial_state: Any = None, max_batches: int = 0,
                    reduce: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None
                    ) -> dict[str, float]:
    """Loss, ppl, accuracy and seq_accuracy of ``model`` over one pass of ``reader``.

    Detection models (``spec.task == "detect"``) report their losses and COCO AP instead
    (:func:`hotloop.detection.evaluate.evaluate_detection`; one process: AP needs every prediction).

    ``initial_state`` is the carried state for streamed problems (None otherwise);
    ``max_batches`` > 0 limits the pass; ``reduce`` sums statistics over ranks.
    One host sync at the end.
    """
    spec = getattr(model, "spec", None)
    if spec is not None and spec.task == "detect":      # loss metrics plus COCO box (and mask) AP
        from ..detection.evaluate import evaluate_detection
        return evaluate_detection(model, reader, device=device, num_classes=spec.target_vocab_size,
                                  max_batches=max_batches)
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


def evaluate_checkpoint(path: str | Path, splits: Sequence[str] = ("valid", "test"), *,
                        device: str | torch.device = "cpu", data_dir: str | None = None,
                        raw_dir: str | None = None, max_batches: int = 0
                        ) -> dict[str, dict[str, float] | str]:
    """Rebuild the run recorded in checkpoint ``path`` and evaluate each split.

    Returns ``split -> metrics``, or ``split -> reason`` for a split the problem lacks.
    """
    from .restore import load_trained

    trained = load_trained(path, device=device, data_dir=data_dir, raw_dir=raw_dir)
    problem, hp, spec, model, precision = (trained.problem, trained.hp, trained.spec, trained.model,
                                           trained.precision)
    device = torch.device(device)
    results: dict[str, dict[str, float] | str] = {}
    for split in splits:
        try:
            reader = problem.reader(split, hp, shuffle=False)
        except (ValueError, FileNotFoundError, KeyError) as exc:
            results[split] = f"not available ({exc})"
            continue
        state = model.initial_state(hp.batch_size, device) if spec.streamed else None
        results[split] = evaluate_reader(model, reader, device=device, precision=precision,
                                         initial_state=state, max_batches=max_batches)
    return results
