"""Non-maximum suppression in torch, vectorised and without a host sync per box.

Greedy NMS keeps box ``i`` (in descending score order) iff no *kept* box ranked
before it overlaps it by IoU > ``iou_threshold``. With ``over[j, i]`` = "j
ranks before i and overlaps it", the kept set is the unique fixed point of
``keep[i] = not any_j(keep[j] and over[j, i])``: entry ``i`` only depends on
entries before it, so iterating from ``keep = all`` is exact after at most
``chain depth`` rounds (usually a handful). :func:`nms_mask` runs those rounds
on the device and checks convergence only every ``check_every`` rounds, so the
host syncs are a few per call, never one per box. :func:`nms` additionally
turns the mask into indices (one more sync for the data-dependent size).

Per-class (or per-image) suppression uses the coordinate-offset trick: boxes of
different groups are shifted apart so they never overlap.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .boxes import box_iou

__all__ = ["nms_mask", "nms", "batched_nms", "batched_nms_mask"]


def nms_mask(boxes: Tensor, scores: Tensor, iou_threshold: float, *, check_every: int = 4) -> Tensor:
    """boxes [N, 4] xyxy, scores [N] -> keep bool [N] (in the input order).

    Ties in score keep the input order (stable sort), like a stable greedy NMS.
    """
    n = boxes.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.bool, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices        # [N]
    ranked = boxes[order]                                                   # [N, 4]
    iou = box_iou(ranked, ranked)                                           # [N, N]
    earlier = torch.ones(n, n, dtype=torch.bool, device=boxes.device).triu(diagonal=1)
    over = (iou > iou_threshold) & earlier                                  # over[j, i]: j < i overlaps i
    keep = torch.ones(n, dtype=torch.bool, device=boxes.device)             # [N] in rank order
    rounds = 0
    while rounds < n:
        previous = keep
        for _ in range(check_every):
            keep = ~(over & keep[:, None]).any(dim=0)
        rounds += check_every
        if torch.equal(keep, previous):                                     # one sync per check
            break
    out = torch.empty_like(keep)
    out[order] = keep
    return out


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Indices (int64) of the kept boxes, sorted by descending score."""
    keep = nms_mask(boxes, scores, iou_threshold)
    idx = torch.nonzero(keep).flatten()
    return idx[torch.sort(scores[idx], descending=True, stable=True).indices]


def _offset_boxes(boxes: Tensor, groups: Tensor) -> Tensor:
    """Shift each group's boxes by ``group * span`` so different groups never overlap."""
    if boxes.numel() == 0:
        return boxes
    span = boxes.max() - boxes.min() + 1                                     # stays on the device
    return boxes + (groups.to(boxes.dtype) * span)[:, None]


def batched_nms_mask(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """NMS within each group (class or image id): keep bool [N] in the input order."""
    return nms_mask(_offset_boxes(boxes, groups), scores, iou_threshold)


def batched_nms(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """Indices of the boxes kept by per-group NMS, sorted by descending score."""
    return nms(_offset_boxes(boxes, groups), scores, iou_threshold)
