"""Anchor generation for detectors with one or more feature levels (FPN, YOLO).

A level with stride ``s`` and a ``H x W`` feature map gets, at every cell
``(y, x)``, one anchor per (size, aspect ratio) pair, centred at
``((x + offset) * s, (y + offset) * s)``. Aspect ratio ``r`` is height / width
and keeps the area: ``w = size / sqrt(r)``, ``h = size * sqrt(r)``.

The anchors of a level are ordered ``(y, x, anchor)``, matching a head output
``[B, A * k, H, W]`` permuted to ``[B, H, W, A, k]`` and flattened.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cell_anchors", "grid_anchors", "multilevel_anchors"]


def cell_anchors(sizes: tuple[float, ...], aspect_ratios: tuple[float, ...], *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Tensor:
    """[A, 4] xyxy anchors centred at 0, A = len(sizes) * len(aspect_ratios), size-major order."""
    size = torch.as_tensor(sizes, dtype=dtype, device=device)                 # [S]
    ratio = torch.as_tensor(aspect_ratios, dtype=dtype, device=device)        # [R]
    h = (size[:, None] * ratio.sqrt()[None, :]).reshape(-1)                   # [A]
    w = (size[:, None] / ratio.sqrt()[None, :]).reshape(-1)                   # [A]
    return torch.stack((-w / 2, -h / 2, w / 2, h / 2), dim=1)


def grid_anchors(base: Tensor, height: int, width: int, stride: float, offset: float = 0.5) -> Tensor:
    """base [A, 4] -> [H * W * A, 4] anchors shifted to every cell of a ``H x W`` map."""
    ys = (torch.arange(height, device=base.device, dtype=base.dtype) + offset) * stride   # [H]
    xs = (torch.arange(width, device=base.device, dtype=base.dtype) + offset) * stride    # [W]
    cy, cx = torch.meshgrid(ys, xs, indexing="ij")                                        # [H, W]
    shifts = torch.stack((cx, cy, cx, cy), dim=-1).reshape(-1, 1, 4)                     # [H*W, 1, 4]
    return (shifts + base[None]).reshape(-1, 4)


def multilevel_anchors(feature_shapes: list[tuple[int, int]], strides: list[float],
                       sizes: list[tuple[float, ...]], aspect_ratios: tuple[float, ...], *,
                       offset: float = 0.5, dtype: torch.dtype = torch.float32,
                       device: torch.device | str | None = None) -> list[Tensor]:
    """One ``[H_l * W_l * A_l, 4]`` anchor tensor per level (sizes[l] are level l's sizes)."""
    if not len(feature_shapes) == len(strides) == len(sizes):
        raise ValueError("multilevel_anchors: feature_shapes, strides and sizes need one entry per level")
    return [grid_anchors(cell_anchors(level_sizes, aspect_ratios, dtype=dtype, device=device), h, w, s, offset)
            for (h, w), s, level_sizes in zip(feature_shapes, strides, sizes)]
