"""COCO mAP on worked examples, and the COCO export read back by pycocotools."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hotloop.detection import coco_evaluate
from hotloop.problems.shapes_render import masks_to_boxes


def _gt():
    masks = np.zeros((2, 40, 40), dtype=bool)
    masks[0, 5:25, 5:25] = True                       # 20 x 20 square, class 0
    masks[1, 30:38, 10:30] = True                     # 20 x 8 bar, class 1
    return [{"boxes": masks_to_boxes(masks), "labels": np.array([0, 1]), "masks": masks}]


def _perfect(gt):
    g = gt[0]
    return [{"boxes": g["boxes"], "scores": np.array([0.9, 0.8]), "labels": g["labels"], "masks": g["masks"]}]


def test_perfect_predictions_score_one():
    gt = _gt()
    out = coco_evaluate(_perfect(gt), gt, height=40, width=40, num_classes=2)
    for key in ("box_ap", "box_ap50", "box_ap75", "mask_ap", "mask_ap50"):
        assert out[key] == pytest.approx(1.0), key


def test_no_predictions_score_zero_and_empty_gt_is_nan():
    gt = _gt()
    empty = [{"boxes": np.zeros((0, 4)), "scores": np.zeros(0), "labels": np.zeros(0, dtype=int)}]
    out = coco_evaluate(empty, gt, height=40, width=40, num_classes=2, with_masks=False)
    assert out == {"box_ap": 0.0, "box_ap50": 0.0, "box_ap75": 0.0}
    none = [{"boxes": np.zeros((0, 4)), "labels": np.zeros(0, dtype=int)}]
    assert math.isnan(coco_evaluate(empty, none, height=40, width=40, num_classes=2)["box_ap"])


@pytest.mark.parametrize("shift", [2.0, 6.0, 12.0])
def test_shifted_box_thresholds(shift):
    # class 0's 20 x 20 box shifted right by `shift`: IoU = (20 - s) * 20 / (800 - (20 - s) * 20),
    # i.e. 0.818 (s=2), 0.538 (s=6), 0.25 (s=12); COCO matches when IoU >= threshold
    overlap = (20 - shift) * 20
    iou = overlap / (800 - overlap)
    gt = _gt()
    pred = _perfect(gt)[0]
    pred["boxes"] = pred["boxes"].copy()
    pred["boxes"][0, [0, 2]] += shift
    out = coco_evaluate([pred], gt, height=40, width=40, num_classes=2, with_masks=False)
    passed = [t for t in np.linspace(0.5, 0.95, 10) if iou >= t]
    # class 1 is perfect (AP 1 at every threshold); class 0 scores 1 exactly at the thresholds below its IoU
    assert out["box_ap50"] == pytest.approx((1.0 + (iou > 0.5)) / 2)
    assert out["box_ap75"] == pytest.approx((1.0 + (iou > 0.75)) / 2)
    assert out["box_ap"] == pytest.approx((1.0 + len(passed) / 10) / 2)


def test_wrong_class_and_low_ranked_false_positive():
    gt = _gt()
    pred = _perfect(gt)[0]
    wrong = dict(pred, labels=np.array([1, 0]))                # both boxes labelled with the other class
    assert coco_evaluate([wrong], gt, height=40, width=40, num_classes=2, with_masks=False)["box_ap50"] == 0.0
    # a false positive ranked below the true positive leaves AP at 1; ranked above, class 0's AP50 halves-ish
    extra_box = np.array([[0.0, 0.0, 4.0, 4.0]], dtype=np.float32)
    low = {"boxes": np.concatenate([pred["boxes"], extra_box]), "scores": np.array([0.9, 0.8, 0.1]),
           "labels": np.array([0, 1, 0])}
    assert coco_evaluate([low], gt, height=40, width=40, num_classes=2)["box_ap50"] == pytest.approx(1.0)
    high = dict(low, scores=np.array([0.5, 0.8, 0.9]))
    # class 0: precision 1/2 at recall 1 -> interpolated AP = 0.5; class 1: 1.0
    assert coco_evaluate([high], gt, height=40, width=40, num_classes=2)["box_ap50"] == pytest.approx(0.75)
