"""RoIAlign in torch (differentiable through autograd), plus FPN level assignment.

For each region ``(batch_index, x1, y1, x2, y2)`` (input-image coordinates)
the box is scaled by ``spatial_scale`` and, with ``aligned=True``, shifted by
-0.5 so pixel centres sit at integer + 0.5. It is split into
``out_h x out_w`` bins; each bin averages ``grid_h x grid_w`` bilinear samples
at the sub-bin centres (``sampling_ratio`` per side, or
``ceil(roi_size / out_size)`` when ``sampling_ratio <= 0``). A sample further
than one pixel outside the map contributes 0; otherwise coordinates are clamped
at 0 and at the last row/column, as in Mask R-CNN's reference implementation.

The forward pass gathers the 4 bilinear neighbours of every sample from a
channels-last view of the features, so its backward (from autograd) is an
index-add. Adaptive sampling needs the largest grid over all regions: one
host sync per call; a fixed ``sampling_ratio`` needs none.
:mod:`hotloop.ops.roi_align_separable` computes the same bins with two batched GEMMs per call
(``formulation="separable"``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .roi_align_separable import pool_separable

__all__ = ["roi_align", "fpn_levels", "multiscale_roi_align", "axis_samples", "ROI_ALIGN_FORMULATIONS"]

#: ``roi_align``'s formulations (``Strategy.roi_align_impl``)
ROI_ALIGN_FORMULATIONS = ("gather", "separable")


def _axis_samples(start: Tensor, size: Tensor, bins: int, grid: Tensor, max_grid: int,
                  limit: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sample positions along one axis -> (low index, high index, weights low/high) [K, bins*G].

    Weights already include the 1/grid average and the out-of-range zeroing.
    """
    k = start.shape[0]
    bin_size = size / bins                                                       # [K]
    steps = torch.arange(max_grid, device=start.device, dtype=start.dtype)       # [G]
    bin_index = torch.arange(bins, device=start.device, dtype=start.dtype)       # [P]
    grid_f = grid.to(start.dtype)[:, None, None]                                 # [K, 1, 1]
    pos = (start[:, None, None] + bin_index[None, :, None] * bin_size[:, None, None]
           + (steps[None, None, :] + 0.5) * bin_size[:, None, None] / grid_f)    # [K, P, G]
    used = steps[None, None, :] < grid_f                                         # [K, 1, G]
    valid = (pos >= -1.0) & (pos <= limit) & used                                # [K, P, G]
    pos = pos.clamp(min=0)
    low = pos.floor()
    at_edge = low >= limit - 1                                                   # past the last centre
    low = torch.where(at_edge, torch.full_like(low, limit - 1), low)
    frac = torch.where(at_edge, torch.zeros_like(pos), pos - low)                # [K, P, G]
    low_i = low.long()
    high_i = (low_i + 1).clamp(max=limit - 1)
    scale = valid.to(start.dtype) / grid_f                                       # [K, P, G]
    shape = (k, bins * max_grid)
    return (low_i.reshape(shape), high_i.reshape(shape),
            ((1 - frac) * scale).reshape(shape), (frac * scale).reshape(shape))


def axis_samples(features: Tensor, rois: Tensor, out_h: int, out_w: int, spatial_scale: float,
                 sampling_ratio: int, aligned: bool) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], int, int]:
    """The sample rows and columns of every region's bins: ((low, high, weight low, weight high)
    along y, the same along x, each [K, bins*G], grid rows, grid columns)."""
    height, width = features.shape[-2:]
    k = rois.shape[0]
    # sample coordinates in (at least) float32 even when the features are half precision
    rois = rois.to(torch.float64 if features.dtype == torch.float64 else torch.float32)
    offset = 0.5 if aligned else 0.0
    x1 = rois[:, 1] * spatial_scale - offset
    y1 = rois[:, 2] * spatial_scale - offset
    roi_w = rois[:, 3] * spatial_scale - offset - x1
    roi_h = rois[:, 4] * spatial_scale - offset - y1
    if not aligned:
        roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
    if sampling_ratio > 0:
        grid_h = torch.full((k,), sampling_ratio, device=rois.device, dtype=torch.long)
        grid_w, max_gh, max_gw = grid_h, sampling_ratio, sampling_ratio
    else:
        grid_h = torch.ceil(roi_h / out_h).long().clamp(min=1)
        grid_w = torch.ceil(roi_w / out_w).long().clamp(min=1)
        max_gh, max_gw = (int(v) for v in torch.stack((grid_h.max(), grid_w.max())).tolist())  # one sync
    return (_axis_samples(y1, roi_h, out_h, grid_h, max_gh, height),
            _axis_samples(x1, roi_w, out_w, grid_w, max_gw, width), max_gh, max_gw)


def roi_align(features: Tensor, rois: Tensor, output_size: int | tuple[int, int],
              spatial_scale: float = 1.0, sampling_ratio: int = 2, aligned: bool = True, *,
              formulation: str = "gather") -> Tensor:
    """features [N, C, H, W], rois [K, 5] ``(batch_index, x1, y1, x2, y2)`` -> [K, C, out_h, out_w].

    ``formulation``: ``"gather"`` (below) or ``"separable"`` (two batched GEMMs,
    :mod:`hotloop.ops.roi_align_separable`); the same bins, another summation order."""
    if formulation not in ROI_ALIGN_FORMULATIONS:
        raise ValueError(f"roi_align formulation {formulation!r}; choose one of {list(ROI_ALIGN_FORMULATIONS)}")
    out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else output_size
    k, c = rois.shape[0], features.shape[1]
    if k == 0:
        return features.new_zeros(k, c, out_h, out_w)
    along_y, along_x, max_gh, max_gw = axis_samples(features, rois, out_h, out_w, spatial_scale,
                                                    sampling_ratio, aligned)
    if formulation == "separable":
        return pool_separable(features, rois, along_y, along_x, out_h, out_w)
    return _pool_gather(features, rois, along_y, along_x, out_h, out_w, max_gh, max_gw)


def _pool_gather(features: Tensor, rois: Tensor, along_y: tuple[Tensor, ...], along_x: tuple[Tensor, ...],
                 out_h: int, out_w: int, max_gh: int, max_gw: int) -> Tensor:
    """Each sample's four bilinear neighbours gathered and weighted, then each bin's grid summed."""
    n, c, height, width = features.shape
    k = rois.shape[0]
    y_lo, y_hi, wy_lo, wy_hi = along_y                                                   # [K, Sy]
    x_lo, x_hi, wx_lo, wx_hi = along_x                                                   # [K, Sx]
    base = rois[:, 0].long() * (height * width)                                          # [K]
    flat = features.permute(0, 2, 3, 1).reshape(n * height * width, c)                   # [N*H*W, C]
    out = None
    for rows, wy in ((y_lo, wy_lo), (y_hi, wy_hi)):
        for cols, wx in ((x_lo, wx_lo), (x_hi, wx_hi)):
            index = base[:, None, None] + rows[:, :, None] * width + cols[:, None, :]      # [K, Sy, Sx]
            weight = (wy[:, :, None] * wx[:, None, :]).to(features.dtype)                # [K, Sy, Sx]
            term = flat.index_select(0, index.reshape(-1)).reshape(k, *index.shape[1:], c)
            term = term * weight[..., None]                                               # [K, Sy, Sx, C]
            out = term if out is None else out + term
    out = out.reshape(k, out_h, max_gh, out_w, max_gw, c).sum(dim=(2, 4))                # [K, oh, ow, C]
    return out.permute(0, 3, 1, 2).contiguous()                                          # [K, C, oh, ow]


def fpn_levels(boxes: Tensor, min_level: int, max_level: int, canonical_size: float = 224.0,
               canonical_level: int = 4) -> Tensor:
    """FPN paper's level for each box [K, 4]: ``floor(k0 + log2(sqrt(area) / 224))``, clamped."""
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).clamp(min=1e-6)
    level = torch.floor(canonical_level + torch.log2(area.sqrt() / canonical_size + 1e-8))
    return level.clamp(min_level, max_level).long()


def multiscale_roi_align(features: list[Tensor], rois: Tensor, output_size: int,
                         strides: list[int], sampling_ratio: int = 2, canonical_size: float = 224.0,
                         canonical_level: int = 4, formulation: str = "gather") -> Tensor:
    """RoIAlign each region on its FPN level. features[i] has stride strides[i] (powers of 2).

    rois [K, 5] -> [K, C, output_size, output_size]. Selecting the regions of a
    level is data-dependent (one host sync per level). ``formulation``: :func:`roi_align`'s.
    """
    levels = [int(round(math.log2(s))) for s in strides]
    level = fpn_levels(rois[:, 1:], levels[0], levels[-1], canonical_size, canonical_level)   # [K]
    out = features[0].new_zeros(rois.shape[0], features[0].shape[1], output_size, output_size)
    for feature, stride, lvl in zip(features, strides, levels):
        idx = torch.nonzero(level == lvl).flatten()
        if idx.numel():
            pooled = roi_align(feature, rois[idx], output_size, 1.0 / stride, sampling_ratio, True,
                               formulation=formulation)
            out = out.index_copy(0, idx, pooled.to(out.dtype))   # autocast may pool in another dtype
    return out
