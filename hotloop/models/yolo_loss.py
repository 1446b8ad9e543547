"""YOLOv3 target assignment and loss, vectorised over padded targets (no host sync).

Each ground-truth box goes to the one anchor (of all scales) whose shape
matches it best (IoU of the ``w x h`` rectangles centred together), at the cell
holding its centre on that anchor's scale. Per scale:

- objectness: BCE on every prediction, except the non-assigned ones whose
  decoded box already overlaps some ground truth by IoU > ``ignore_threshold``;
- box: BCE of ``sigmoid(tx, ty)`` against the centre's offset in its cell (minus
  the offset's entropy, so a perfect fit scores 0) and
  squared error of ``tw, th`` against ``log(w / anchor_w)``, both weighted by
  ``2 - w * h / image_area`` (small boxes count more);
- class: per-class BCE (multi-label sigmoid) on assigned predictions.

Losses are summed over predictions and averaged over images. Padding targets
(label -1) and duplicate assignments are routed to a dump row that is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..ops.boxes import box_iou, box_xyxy_to_cxcywh, yolo_decode, yolo_encode

__all__ = ["YoloScale", "YoloLossParts", "yolo_loss", "scale_grid", "best_anchor"]


@dataclass(frozen=True)
class YoloScale:
    """One detection scale: its stride and its anchors' (w, h) in pixels (A = len(anchors))."""

    stride: int
    anchors: tuple[tuple[float, float], ...]


@dataclass
class YoloLossParts:
    """Summed (over the batch) loss terms; ``total`` is divided by the batch size."""

    total: Tensor
    objectness: Tensor
    box: Tensor
    classification: Tensor
    positives: Tensor


def scale_grid(height: int, width: int, anchors: Tensor) -> tuple[Tensor, Tensor]:
    """Cell (x, y) [1, 1, H, W, 2] and anchor (w, h) [1, A, 1, 1, 2] tensors broadcastable to [B, A, H, W, 2]."""
    ys = torch.arange(height, device=anchors.device, dtype=anchors.dtype)
    xs = torch.arange(width, device=anchors.device, dtype=anchors.dtype)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")                                  # [H, W]
    return torch.stack((gx, gy), dim=-1)[None, None], anchors[None, :, None, None, :]


def best_anchor(gt_wh: Tensor, anchors: Tensor) -> Tensor:
    """gt_wh [..., 2], anchors [K, 2] -> index [...] of the anchor of largest centred IoU."""
    inter = torch.minimum(gt_wh[..., None, :], anchors).prod(-1)                   # [..., K]
    union = gt_wh.prod(-1)[..., None] + anchors.prod(-1) - inter
    return (inter / union.clamp(min=1e-9)).argmax(-1)


def yolo_loss(outputs: list[Tensor], scales: list[YoloScale], boxes: Tensor, labels: Tensor,
              image_size: tuple[int, int], num_classes: int, ignore_threshold: float = 0.5) -> YoloLossParts:
    """outputs[s]: raw head output [B, A, H, W, 5 + K]; boxes [B, N, 4] xyxy; labels [B, N] (-1 = padding)."""
    batch = boxes.shape[0]
    dtype = outputs[0].dtype
    device = boxes.device
    all_anchors = torch.tensor([wh for s in scales for wh in s.anchors], device=device, dtype=torch.float32)
    per_scale = len(scales[0].anchors)
    valid = labels >= 0                                                              # [B, N]
    gt = box_xyxy_to_cxcywh(boxes.float())                                           # [B, N, 4]
    chosen = best_anchor(gt[..., 2:].clamp(min=1e-3), all_anchors)                   # [B, N]
    image_area = float(image_size[0] * image_size[1])
    zero = outputs[0].new_zeros((), dtype=torch.float32)
    obj_sum, box_sum, cls_sum, pos_sum = zero, zero, zero, zero
    for level, (out, scale) in enumerate(zip(outputs, scales)):
        out = out.float()
        _, anchors_n, height, width, _ = out.shape
        anchors = torch.tensor(scale.anchors, device=device, dtype=torch.float32)   # [A, 2]
        grid, anchor_wh = scale_grid(height, width, anchors)
        cells = batch * anchors_n * height * width
        mine = valid & (chosen // per_scale == level)                                # [B, N]
        gx = (gt[..., 0] / scale.stride).floor().clamp(0, width - 1).long()          # [B, N]
        gy = (gt[..., 1] / scale.stride).floor().clamp(0, height - 1).long()
        image_index = torch.arange(batch, device=device)[:, None]                    # [B, 1]
        flat = ((image_index * anchors_n + chosen % per_scale) * height + gy) * width + gx
        flat = torch.where(mine, flat, torch.full_like(flat, cells)).reshape(-1)     # [B*N], dump = cells

        assigned_anchor = anchors[(chosen % per_scale).reshape(-1)]                  # [B*N, 2]
        cell_xy = torch.stack((gx, gy), dim=-1).reshape(-1, 2)
        box_target = yolo_encode(boxes.float().reshape(-1, 4), cell_xy, assigned_anchor, scale.stride)
        weight = 2.0 - gt[..., 2].reshape(-1) * gt[..., 3].reshape(-1) / image_area  # [B*N]
        onehot = F.one_hot(labels.clamp(min=0).reshape(-1), num_classes).float()     # [B*N, K]
        rows = torch.cat((torch.ones_like(weight)[:, None], box_target, weight[:, None], onehot), dim=1)
        table = out.new_zeros(cells + 1, rows.shape[1]).index_copy(0, flat, rows)[:cells]   # [cells, 6 + K]
        positive = table[:, 0]                                                       # [cells]

        pred = out.reshape(cells, -1)                                                # [cells, 5 + K]
        decoded = yolo_decode(out[..., :4].detach(), grid, anchor_wh, scale.stride)  # [B, A, H, W, 4]
        overlap = box_iou(decoded.reshape(batch, -1, 4), boxes.float())              # [B, AHW, N]
        overlap = overlap.masked_fill(~valid[:, None, :], 0.0).amax(-1).reshape(-1) if boxes.shape[1] else \
            torch.zeros(cells, device=device)
        counted = torch.where(overlap > ignore_threshold, positive, torch.ones_like(positive))
        obj = F.binary_cross_entropy_with_logits(pred[:, 4], positive, reduction="none")
        obj_sum = obj_sum + (obj * counted).sum()
        offset = table[:, 1:3]                                                       # [cells, 2] in [0, 1)
        entropy = F.binary_cross_entropy(offset, offset, reduction="none")           # BCE's floor: 0 at the optimum
        xy = (F.binary_cross_entropy_with_logits(pred[:, :2], offset, reduction="none") - entropy).sum(-1)
        wh = (pred[:, 2:4] - table[:, 3:5]).pow(2).sum(-1)
        box_sum = box_sum + ((xy + wh) * table[:, 5] * positive).sum()
        cls = F.binary_cross_entropy_with_logits(pred[:, 5:], table[:, 6:], reduction="none").sum(-1)
        cls_sum = cls_sum + (cls * positive).sum()
        pos_sum = pos_sum + positive.sum()
    total = (obj_sum + box_sum + cls_sum) / batch
    return YoloLossParts(total.to(dtype), obj_sum, box_sum, cls_sum, pos_sum)
