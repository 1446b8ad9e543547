"""Turn dense per-anchor predictions into final detections (score filter + per-class NMS)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..ops.boxes import clip_boxes
from ..ops.nms import batched_nms

__all__ = ["select_detections"]


def select_detections(boxes: Tensor, scores: Tensor, height: int, width: int, *, score_threshold: float = 0.01,
                      nms_threshold: float = 0.5, max_detections: int = 100, pre_nms_top_k: int = 1000,
                      class_specific_boxes: bool = False) -> list[dict[str, Tensor]]:
    """boxes [B, P, 4] (or [B, P, K, 4] when ``class_specific_boxes``), scores [B, P, K] -> per image
    ``boxes`` [D, 4], ``scores`` [D], ``labels`` [D] with D <= ``max_detections``, best first.

    Every (prediction, class) pair is a candidate; the ``pre_nms_top_k`` best above
    ``score_threshold`` go through per-class NMS. The data-dependent sizes cost a
    few host syncs per image (none per box).
    """
    batch, preds, classes = scores.shape
    results = []
    for i in range(batch):
        flat_scores = scores[i].reshape(-1)                                    # [P*K]
        top = torch.topk(flat_scores, min(pre_nms_top_k, flat_scores.numel())).indices
        top = top[flat_scores[top] > score_threshold]
        labels = top % classes
        if class_specific_boxes:
            cand = boxes[i].reshape(-1, 4)[top]                                # [C, 4]
        else:
            cand = boxes[i][top // classes]                                    # [C, 4]
        cand = clip_boxes(cand, height, width)
        ok = (cand[:, 2] > cand[:, 0]) & (cand[:, 3] > cand[:, 1])
        cand, labels, cand_scores = cand[ok], labels[ok], flat_scores[top][ok]
        keep = batched_nms(cand, cand_scores, labels, nms_threshold)[:max_detections]
        results.append({"boxes": cand[keep], "scores": cand_scores[keep], "labels": labels[keep]})
    return results
