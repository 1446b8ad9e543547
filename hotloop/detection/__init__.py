"""Detection support: COCO-format export and COCO mAP evaluation (pycocotools).

``hotloop.detection.evaluate.evaluate_detection`` (loss + mAP of a model over a
reader) is not imported here, so this package does not import ``hotloop.train``.
"""
from __future__ import annotations

from .coco_eval import CocoAccumulator, batch_ground_truth, coco_evaluate
from .coco_format import coco_ground_truth, coco_results, encode_mask, export_coco

__all__ = ["CocoAccumulator", "batch_ground_truth", "coco_evaluate", "coco_ground_truth", "coco_results",
           "encode_mask", "export_coco"]
