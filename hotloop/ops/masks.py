"""Instance-mask helpers: paste ``M x M`` box-relative masks into the image, and
crop image masks to boxes (Mask R-CNN's mask targets).

Pasting: image pixel ``(y, x)`` (centre ``(y + 0.5, x + 0.5)``) inside box
``(x1, y1, x2, y2)`` reads the mask at ``u = (x + 0.5 - x1) / (x2 - x1) * M - 0.5``
(and likewise ``v``) by bilinear interpolation, with the mask padded by zeros;
pixels whose centre lies outside the box get 0. This is
``grid_sample(align_corners=False, padding_mode="zeros")``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .roi_align import roi_align

__all__ = ["paste_masks", "crop_masks"]


def paste_masks(masks: Tensor, boxes: Tensor, height: int, width: int,
                threshold: float | None = 0.5) -> Tensor:
    """masks [N, M, M] (probabilities), boxes [N, 4] xyxy -> [N, H, W].

    Returns bool masks (``value >= threshold``), or the soft values when
    ``threshold`` is None.
    """
    n = masks.shape[0]
    if n == 0:
        shape = (0, height, width)
        return masks.new_zeros(shape, dtype=torch.bool) if threshold is not None else masks.new_zeros(shape)
    dtype = masks.dtype if masks.is_floating_point() else torch.float32
    masks = masks.to(dtype)
    boxes = boxes.to(dtype)
    xs = torch.arange(width, device=masks.device, dtype=dtype) + 0.5              # [W]
    ys = torch.arange(height, device=masks.device, dtype=dtype) + 0.5             # [H]
    box_w = (boxes[:, 2] - boxes[:, 0]).clamp(min=1e-6)                            # [N]
    box_h = (boxes[:, 3] - boxes[:, 1]).clamp(min=1e-6)
    gx = (xs[None, :] - boxes[:, 0:1]) / box_w[:, None] * 2 - 1                    # [N, W]
    gy = (ys[None, :] - boxes[:, 1:2]) / box_h[:, None] * 2 - 1                    # [N, H]
    grid = torch.stack((gx[:, None, :].expand(n, height, width),
                        gy[:, :, None].expand(n, height, width)), dim=-1)         # [N, H, W, 2]
    soft = F.grid_sample(masks[:, None], grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False)[:, 0]                               # [N, H, W]
    inside = ((gx.abs() <= 1)[:, None, :] & (gy.abs() <= 1)[:, :, None])           # [N, H, W]
    soft = soft * inside
    return soft >= threshold if threshold is not None else soft


def crop_masks(masks: Tensor, boxes: Tensor, size: int) -> Tensor:
    """Image masks [N, H, W] (bool or float) cropped to boxes [N, 4] and resized -> float [N, size, size].

    Uses RoIAlign (aligned, 2x2 samples per bin) on each mask's own box.
    """
    n = masks.shape[0]
    if n == 0:
        return masks.new_zeros((0, size, size), dtype=torch.float32)
    index = torch.arange(n, device=masks.device, dtype=torch.float32)[:, None]     # [N, 1]
    rois = torch.cat((index, boxes.to(torch.float32)), dim=1)                      # [N, 5]
    return roi_align(masks[:, None].to(torch.float32), rois, size, 1.0, 2, True)[:, 0]
