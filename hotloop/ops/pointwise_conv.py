"""A small 1x1 convolution as one GEMM (``Strategy.pointwise_conv``).

A stride-1, unpadded, one-group 1x1 convolution is a matrix product over the positions:
``y[n, :, h, w] = W[O, C] @ x[n, :, h, w] + b``. When the call is small (a detector's coarse
levels: a few million multiply-adds) oneDNN's convolution spends more on each call than on the
arithmetic, and the GEMM (with its two GEMMs of the backward, from autograd) is faster on the
CPUs measured (``docs/engine.md``). ``"gemm"`` computes such a call as ``torch.mm`` on the
channels-last rows ([N*H*W, C] @ [C, O]) or ``torch.matmul`` on the NCHW planes
(W @ [N, C, H*W]), without copying ``x``; calls of more than :data:`POINTWISE_GEMM_MAX_MACS`
multiply-adds (N*H*W*C*O), and other layouts, stay ``F.conv2d``. The result is
the same sum in another order (fp32 rounding); autocast casts a GEMM as it casts a convolution.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["POINTWISE_CONVS", "POINTWISE_GEMM_MAX_MACS", "pointwise_conv2d"]

#: ``Strategy.pointwise_conv`` values: aten's convolution, or one GEMM for small calls
POINTWISE_CONVS = ("aten", "gemm")
#: multiply-adds (N * H * W * C * O) up to which a 1x1 convolution runs as one GEMM
POINTWISE_GEMM_MAX_MACS = 1 << 22


def pointwise_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, mode: str = "aten") -> Tensor:
    """A stride-1, unpadded, one-group 1x1 convolution; ``mode="gemm"`` makes a small call one GEMM
    (module doc). x [N, C, H, W], weight [O, C, 1, 1] -> [N, O, H, W]."""
    n, c, h, w = x.shape
    out = weight.shape[0]
    if mode != "gemm" or n * h * w * c * out > POINTWISE_GEMM_MAX_MACS:
        return F.conv2d(x, weight, bias)
    w2d = weight.reshape(out, c)                                             # [O, C]
    if x.is_contiguous(memory_format=torch.channels_last):
        rows = x.permute(0, 2, 3, 1).reshape(n * h * w, c)                   # [N*H*W, C], a view
        y = torch.addmm(bias, rows, w2d.t()) if bias is not None else rows @ w2d.t()    # [N*H*W, O]
        return y.view(n, h, w, out).permute(0, 3, 1, 2)                      # [N, O, H, W], channels_last
    if x.is_contiguous():
        y = torch.matmul(w2d, x.view(n, c, h * w))                           # [N, O, H*W]
        if bias is not None:
            y = y + bias[:, None]
        return y.view(n, out, h, w)
    return F.conv2d(x, weight, bias)
