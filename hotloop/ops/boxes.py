"""Box geometry in torch: areas, pairwise IoU, clipping, and box coding.

Boxes are ``[..., 4]`` float tensors in ``xyxy`` order (x1, y1, x2, y2), with
width ``x2 - x1`` (no "+1" pixel convention). Every function is
device-agnostic and free of host syncs.

Two codings are provided:

- :class:`BoxCoder`: the Faster R-CNN parametrisation
  ``(dx, dy, dw, dh) = (wx * (gx - px) / pw, wy * (gy - py) / ph, ww * log(gw / pw), wh * log(gh / ph))``
  relative to reference boxes (anchors or proposals), with ``dw, dh`` clamped on
  decode so ``exp`` cannot overflow.
- :func:`yolo_encode` / :func:`yolo_decode`: the YOLOv3 parametrisation
  ``cx = (sigmoid(tx) + grid_x) * stride``, ``w = anchor_w * exp(tw)``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["box_area", "box_iou", "clip_boxes", "box_xyxy_to_cxcywh", "box_cxcywh_to_xyxy",
           "BoxCoder", "yolo_encode", "yolo_decode", "DEFAULT_SCALE_CLAMP"]

DEFAULT_SCALE_CLAMP = math.log(1000.0 / 16)  # largest dw/dh fed to exp on decode


def box_area(boxes: Tensor) -> Tensor:
    """[..., 4] -> [...] areas (0 for inverted boxes)."""
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """Pairwise IoU: [..., N, 4], [..., M, 4] -> [..., N, M] (leading dims broadcast).

    Pairs with zero union get IoU 0.
    """
    area1 = box_area(boxes1)[..., :, None]                                 # [..., N, 1]
    area2 = box_area(boxes2)[..., None, :]                                 # [..., 1, M]
    top_left = torch.maximum(boxes1[..., :, None, :2], boxes2[..., None, :, :2])     # [..., N, M, 2]
    bottom_right = torch.minimum(boxes1[..., :, None, 2:], boxes2[..., None, :, 2:])
    wh = (bottom_right - top_left).clamp(min=0)                            # [..., N, M, 2]
    inter = wh[..., 0] * wh[..., 1]                                        # [..., N, M]
    union = area1 + area2 - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny),
                       torch.zeros_like(inter))


def clip_boxes(boxes: Tensor, height: int, width: int) -> Tensor:
    """Clamp [..., 4] boxes into the image ``[0, width] x [0, height]``."""
    x = boxes[..., 0::2].clamp(0, width)
    y = boxes[..., 1::2].clamp(0, height)
    return torch.stack((x[..., 0], y[..., 0], x[..., 1], y[..., 1]), dim=-1)


def box_xyxy_to_cxcywh(boxes: Tensor) -> Tensor:
    """[..., 4] xyxy -> [..., 4] (centre x, centre y, width, height)."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), dim=-1)


def box_cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """[..., 4] (cx, cy, w, h) -> [..., 4] xyxy."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), dim=-1)


class BoxCoder:
    """Faster R-CNN box deltas relative to reference boxes, with per-coordinate ``weights``."""

    def __init__(self, weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0),
                 scale_clamp: float = DEFAULT_SCALE_CLAMP) -> None:
        self.weights = tuple(float(w) for w in weights)
        self.scale_clamp = scale_clamp

    def encode(self, reference: Tensor, target: Tensor) -> Tensor:
        """reference, target [..., 4] xyxy (positive sizes) -> deltas [..., 4]."""
        wx, wy, ww, wh = self.weights
        ref = box_xyxy_to_cxcywh(reference)
        tgt = box_xyxy_to_cxcywh(target)
        dx = wx * (tgt[..., 0] - ref[..., 0]) / ref[..., 2]
        dy = wy * (tgt[..., 1] - ref[..., 1]) / ref[..., 3]
        dw = ww * torch.log(tgt[..., 2] / ref[..., 2])
        dh = wh * torch.log(tgt[..., 3] / ref[..., 3])
        return torch.stack((dx, dy, dw, dh), dim=-1)

    def decode(self, deltas: Tensor, reference: Tensor) -> Tensor:
        """deltas [..., 4], reference [..., 4] xyxy -> boxes [..., 4] xyxy."""
        wx, wy, ww, wh = self.weights
        ref = box_xyxy_to_cxcywh(reference.to(deltas.dtype))
        dx = deltas[..., 0] / wx
        dy = deltas[..., 1] / wy
        dw = (deltas[..., 2] / ww).clamp(max=self.scale_clamp)
        dh = (deltas[..., 3] / wh).clamp(max=self.scale_clamp)
        cx = dx * ref[..., 2] + ref[..., 0]
        cy = dy * ref[..., 3] + ref[..., 1]
        w = torch.exp(dw) * ref[..., 2]
        h = torch.exp(dh) * ref[..., 3]
        return box_cxcywh_to_xyxy(torch.stack((cx, cy, w, h), dim=-1))


def yolo_encode(boxes: Tensor, grid_xy: Tensor, anchor_wh: Tensor, stride: float) -> Tensor:
    """YOLOv3 targets for boxes assigned to cells and anchors.

    boxes [..., 4] xyxy (pixels); grid_xy [..., 2] the cell's integer (x, y);
    anchor_wh [..., 2] anchor sizes in pixels. Returns ``[..., 4]``:
    ``(fx, fy, tw, th)`` where ``fx, fy`` in [0, 1) are the centre's offset in the
    cell (the target of ``sigmoid(tx)``) and ``tw = log(w / anchor_w)``.
    """
    c = box_xyxy_to_cxcywh(boxes)
    offset = c[..., :2] / stride - grid_xy.to(c.dtype)                    # [..., 2]
    log_wh = torch.log(c[..., 2:] / anchor_wh.to(c.dtype))                 # [..., 2]
    return torch.cat((offset, log_wh), dim=-1)


def yolo_decode(raw: Tensor, grid_xy: Tensor, anchor_wh: Tensor, stride: float,
                scale_clamp: float = DEFAULT_SCALE_CLAMP) -> Tensor:
    """Raw predictions [..., 4] ``(tx, ty, tw, th)`` -> boxes [..., 4] xyxy in pixels."""
    centre = (torch.sigmoid(raw[..., :2]) + grid_xy.to(raw.dtype)) * stride      # [..., 2]
    wh = torch.exp(raw[..., 2:].clamp(max=scale_clamp)) * anchor_wh.to(raw.dtype)
    return box_cxcywh_to_xyxy(torch.cat((centre, wh), dim=-1))
