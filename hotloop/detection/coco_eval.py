"""COCO mAP with pycocotools: box AP@[.5:.95], AP50, AP75, and the same for masks.

:func:`coco_evaluate` scores per-image predictions against per-image ground
truth (numpy arrays or tensors); :class:`CocoAccumulator` collects them batch
by batch from padded ``detection_shapes`` batches. pycocotools' prints are
silenced. Metrics are ``nan`` when the ground truth has no objects at all, and
0 when there are objects but no predictions.
"""
from __future__ import annotations

import contextlib
import io
import math
from typing import Any, Mapping, Sequence

import numpy as np

from .coco_format import coco_ground_truth, coco_results

__all__ = ["coco_evaluate", "batch_ground_truth", "CocoAccumulator", "METRIC_NAMES"]

METRIC_NAMES = ("ap", "ap50", "ap75")


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _as_numpy(items: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
    return [{key: _numpy(value) for key, value in item.items() if value is not None} for item in items]


def _run(gt: dict[str, Any], results: list[dict[str, Any]], iou_type: str) -> dict[str, float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not gt["annotations"]:
        return {name: math.nan for name in METRIC_NAMES}
    if not results:
        return {name: 0.0 for name in METRIC_NAMES}
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(results)
        evaluator = COCOeval(coco_gt, coco_dt, iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats
    return {name: max(float(stats[i]), 0.0) for i, name in enumerate(METRIC_NAMES)}


def coco_evaluate(predictions: Sequence[Mapping[str, Any]], ground_truth: Sequence[Mapping[str, Any]], *,
                  height: int, width: int, num_classes: int, with_masks: bool | None = None) -> dict[str, float]:
    """Score detections with COCO's protocol.

    predictions[i]: ``boxes`` [K, 4] xyxy, ``scores`` [K], ``labels`` [K] (0-based), optional
    ``masks`` [K, H, W] bool. ground_truth[i]: ``boxes``, ``labels``, optional ``masks``.
    Returns ``box_ap``, ``box_ap50``, ``box_ap75`` and, when ``with_masks`` (default: the
    ground truth and the predictions all have masks), ``mask_ap``, ``mask_ap50``, ``mask_ap75``.
    """
    if len(predictions) != len(ground_truth):
        raise ValueError(f"coco_evaluate: {len(predictions)} predictions for {len(ground_truth)} images")
    preds, gts = _as_numpy(predictions), _as_numpy(ground_truth)
    if with_masks is None:
        with_masks = bool(gts) and all("masks" in g for g in gts) and all("masks" in p for p in preds)
    gt = coco_ground_truth(gts, height, width, [f"class_{i}" for i in range(num_classes)])
    out = {f"box_{k}": v for k, v in _run(gt, coco_results(preds, with_masks=False), "bbox").items()}
    if with_masks:
        segm = coco_results(preds, with_masks=True)
        for entry in segm:
            del entry["bbox"]                     # pycocotools derives it (and the area) from the mask
        out.update({f"mask_{k}": v for k, v in _run(gt, segm, "segm").items()})
    return out


def batch_ground_truth(batch: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    """Split a padded detection batch (``labels`` -1 = padding) into per-image ground truth."""
    labels = _numpy(batch["labels"])                                           # [B, Nmax]
    boxes = _numpy(batch["boxes"])                                             # [B, Nmax, 4]
    masks = _numpy(batch["masks"]) if "masks" in batch else None               # [B, Nmax, H, W]
    out = []
    for row in range(labels.shape[0]):
        keep = labels[row] >= 0
        item = {"boxes": boxes[row][keep], "labels": labels[row][keep]}
        if masks is not None:
            item["masks"] = masks[row][keep].astype(bool)
        out.append(item)
    return out


class CocoAccumulator:
    """Collect predictions and ground truth over batches, then :meth:`compute` COCO metrics once."""

    def __init__(self, num_classes: int, *, with_masks: bool = False) -> None:
        self.num_classes = num_classes
        self.with_masks = with_masks
        self.predictions: list[dict[str, np.ndarray]] = []
        self.ground_truth: list[dict[str, np.ndarray]] = []
        self.size: tuple[int, int] | None = None

    def add(self, predictions: Sequence[Mapping[str, Any]], batch: Mapping[str, Any]) -> None:
        gts = batch_ground_truth(batch)
        if len(predictions) != len(gts):
            raise ValueError(f"CocoAccumulator: {len(predictions)} predictions for {len(gts)} images")
        self.size = tuple(batch["images"].shape[-2:])
        self.predictions.extend(_as_numpy(predictions))
        self.ground_truth.extend(gts)

    def compute(self) -> dict[str, float]:
        if self.size is None:
            return {}
        height, width = self.size
        return coco_evaluate(self.predictions, self.ground_truth, height=height, width=width,
                             num_classes=self.num_classes, with_masks=self.with_masks)
