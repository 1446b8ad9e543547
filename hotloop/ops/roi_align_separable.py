"""RoIAlign as two batched GEMMs: ``roi_align(..., formulation="separable")``, the same bins as the gather one.

A bin's value is the mean of bilinear samples on a grid that is the product of a row grid and a
column grid, so it factors: ``out[k, c] = Wy[k] @ F[b_k, c] @ Wx[k]^T``, where ``Wy[k]`` [out_h, H]
holds, for each output row, the summed interpolation weights of its samples on each feature row
(the grid average and the out-of-map zeroing included), and ``Wx[k]`` [out_w, W] the same along
columns. The gather formulation reads four neighbours per sample (``out_h*out_w*G*G*4`` reads of C
values per region, and an index-add of as many in backward); this one reads each region's image
rows once and does ``out_h*H*C*W + out_h*C*W*out_w`` multiply-adds in GEMMs, whose backward is GEMMs
too. It wins where the feature maps are small next to the samples (the CPU configurations' 16x16
P2 maps: 441 ms -> 99 ms forward + backward for 957 regions of 64 channels on the 2-core EPYC,
``benchmarks/roi_align_impls.py``) and loses on large maps, so it is a formulation the tuner times
(``Strategy.roi_align_impl``).
Only the summation order differs from the gather formulation (fp32 rounding).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pool_separable", "interpolation_matrix"]


def interpolation_matrix(low: Tensor, high: Tensor, w_low: Tensor, w_high: Tensor, bins: int,
                         size: int) -> Tensor:
    """Samples along one axis ([K, bins*G] indices and weights) -> summed weights [K, bins, size]."""
    k = low.shape[0]
    positions = torch.arange(size, device=low.device)                                   # [L]
    weights = ((low[..., None] == positions) * w_low[..., None]
               + (high[..., None] == positions) * w_high[..., None])                    # [K, bins*G, L]
    return weights.reshape(k, bins, -1, size).sum(2)                                    # [K, bins, L]


def pool_separable(features: Tensor, rois: Tensor, along_y: tuple[Tensor, ...], along_x: tuple[Tensor, ...],
                   out_h: int, out_w: int) -> Tensor:
    """features [N, C, H, W], rois [K, 5], each axis's samples ([K, bins*G] indices and weights,
    :func:`hotloop.ops.roi_align.axis_samples`) -> [K, C, out_h, out_w]."""
    n, c, height, width = features.shape
    k = rois.shape[0]
    rows_w = interpolation_matrix(*along_y, out_h, height).to(features.dtype)           # [K, oh, H]
    cols_w = interpolation_matrix(*along_x, out_w, width).to(features.dtype)            # [K, ow, W]
    by_row = features.permute(0, 2, 1, 3).reshape(n, height, c * width)                 # [N, H, C*W]
    region_rows = by_row.index_select(0, rois[:, 0].long())                             # [K, H, C*W]
    pooled_rows = torch.bmm(rows_w, region_rows).reshape(k, out_h * c, width)           # [K, oh*C, W]
    out = torch.bmm(pooled_rows, cols_w.transpose(1, 2))                                # [K, oh*C, ow]
    return out.reshape(k, out_h, c, out_w).permute(0, 2, 1, 3).contiguous()             # [K, C, oh, ow]
