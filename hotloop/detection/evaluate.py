"""Evaluate a detection model over a reader: its losses plus COCO mAP from ``predict``.

:func:`evaluate_detection` is what ``hotloop eval`` (and the trainer's
evaluation) should run for ``task == "detect"`` problems: one pass computing
the model's summable loss statistics (as :func:`hotloop.train.evaluation.evaluate_reader`
does) and its detections, scored by :class:`~hotloop.detection.coco_eval.CocoAccumulator`.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..data.prefetch import to_device
from ..train.metrics import StatsAccumulator, summarize
from .coco_eval import CocoAccumulator

__all__ = ["evaluate_detection", "evaluate_detect_task"]


@torch.no_grad()
def evaluate_detection(model: nn.Module, reader: Any, *, device: torch.device | str = "cpu",
                       num_classes: int, with_masks: bool | None = None, max_batches: int = 0) -> dict[str, float]:
    """Loss metrics and ``box_ap``, ``box_ap50``, ``box_ap75`` (+ ``mask_*`` when the model predicts masks).

    ``with_masks`` defaults to whether the model's detections carry ``masks``.
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    stats = StatsAccumulator()
    coco: CocoAccumulator | None = None
    try:
        for i, batch in enumerate(reader):
            if max_batches and i >= max_batches:
                break
            batch = to_device(batch, device)
            stats.add(model.loss(batch, None, with_accuracy=True).stats)
            detections = model.predict(batch["images"])
            if coco is None:
                masks = with_masks if with_masks is not None else all("masks" in d for d in detections)
                coco = CocoAccumulator(num_classes, with_masks=masks)
            coco.add(detections, batch)
    finally:
        model.train(was_training)
    out = summarize(stats.read())
    out.pop("ppl", None)                                       # exp(detection loss) means nothing
    if coco is not None:
        out.update(coco.compute())
    return out


def evaluate_detect_task(model: nn.Module, reader: Any, *, device: torch.device | str = "cpu",
                         max_batches: int = 0) -> dict[str, float]:
    """The ``detect`` task's evaluator (:data:`hotloop.registry.evaluators`, declared in
    :mod:`hotloop.builtin`): :func:`evaluate_detection` over the model's classes. One process:
    AP needs every prediction."""
    return evaluate_detection(model, reader, device=device, num_classes=model.spec.target_vocab_size,
                              max_batches=max_batches)
