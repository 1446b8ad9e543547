"""A dilated 2-D convolution whose weight gradient skips the zero padding (``Strategy.dilated_conv_wgrad``).

A 3x3 convolution with dilation ``d`` on a map not much larger than ``d`` (DeepLab's ASPP rates
on small maps) reads mostly padding: for a tap offset by ``d`` rows, only ``H - d`` output rows
read the input. oneDNN's weight gradient still visits every padded position, and on a CPU it
runs several times slower than the forward. ``"taps"`` computes the weight gradient as one GEMM
per kernel tap over only the output positions whose input is inside the map::

    grad_w[:, :, ky, kx] = grad_out[n, :, y, x]^T @ x[n, :, y + ky*d - p, x + kx*d - p]   (valid y, x)

The forward and the input gradient stay aten's (the forward is bitwise aten's); the weight
gradient is the same sum in another order (fp32: about 1e-6 relative). A call takes the taps
path only where the valid positions are at most :data:`TAPS_MAX_FRACTION` of the dense ones
(below that the GEMMs beat oneDNN on the machines measured, ``docs/engine.md``); other calls,
and convolutions with stride, groups or a non-zero padding mode, are plain ``F.conv2d``.
Under autocast the operands are cast as autocast casts a convolution, and the backward runs in
that dtype.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DILATED_CONV_WGRADS", "TAPS_MAX_FRACTION", "dilated_conv2d", "tap_weight_grad", "valid_fraction"]

#: ``Strategy.dilated_conv_wgrad`` values: aten's weight gradient, or one GEMM per kernel tap
DILATED_CONV_WGRADS = ("aten", "taps")
#: the taps path runs where the valid positions are at most this share of the dense ones
TAPS_MAX_FRACTION = 0.5


def _tap_ranges(size: int, out: int, kernel: int, dilation: int, padding: int) -> list[tuple[int, int, int]]:
    """Per tap along one axis: (offset, first valid output index, end of valid output indices)."""
    ranges = []
    for k in range(kernel):
        offset = k * dilation - padding
        ranges.append((offset, max(0, -offset), min(out, size - offset)))
    return ranges


def valid_fraction(size: tuple[int, int], kernel: tuple[int, int], dilation: tuple[int, int],
                   padding: tuple[int, int]) -> float:
    """Share of a stride-1 convolution's (output position, tap) pairs whose input is inside the map."""
    share = 1.0
    for axis in range(2):
        out = size[axis] + 2 * padding[axis] - dilation[axis] * (kernel[axis] - 1)
        if out <= 0:
            return 1.0
        ranges = _tap_ranges(size[axis], out, kernel[axis], dilation[axis], padding[axis])
        share *= sum(max(0, end - start) for _, start, end in ranges) / (out * kernel[axis])
    return share


def tap_weight_grad(x: Tensor, grad_out: Tensor, kernel: tuple[int, int], dilation: tuple[int, int],
                    padding: tuple[int, int], like: Tensor) -> Tensor:
    """The weight gradient of a stride-1, one-group convolution, one GEMM per tap over the valid
    positions; laid out like ``like`` (the weight). x [N, C, H, W], grad_out [N, O, Ho, Wo]."""
    n_in, n_out = x.shape[1], grad_out.shape[1]
    x_hwc, g_hwc = x.permute(0, 2, 3, 1), grad_out.permute(0, 2, 3, 1)      # [N, H, W, C], [N, Ho, Wo, O]
    rows = _tap_ranges(x.shape[2], grad_out.shape[2], kernel[0], dilation[0], padding[0])
    cols = _tap_ranges(x.shape[3], grad_out.shape[3], kernel[1], dilation[1], padding[1])
    grad_w = torch.zeros_like(like, dtype=grad_out.dtype)                    # [O, C, kh, kw]
    for ky, (dy, y0, y1) in enumerate(rows):
        for kx, (dx, x0, x1) in enumerate(cols):
            if y0 >= y1 or x0 >= x1:
                continue                                                     # the tap reads only padding
            g = g_hwc[:, y0:y1, x0:x1].reshape(-1, n_out)                    # [M, O]
            xs = x_hwc[:, y0 + dy:y1 + dy, x0 + dx:x1 + dx].reshape(-1, n_in)  # [M, C]
            grad_w[:, :, ky, kx] = g.t() @ xs                                # [O, C]
    return grad_w


class _TapWgradConv(torch.autograd.Function):
    """F.conv2d forward; aten's input and bias gradients; the weight gradient from the taps."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, padding: tuple[int, int],
                dilation: tuple[int, int]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding, ctx.dilation, ctx.has_bias = padding, dilation, bias is not None
        return F.conv2d(x, weight, bias, 1, padding, dilation)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and \
            ctx.needs_input_grad[2]
        grad_x = grad_b = grad_w = None
        if need_x or need_b:
            grad_x, _, grad_b = torch.ops.aten.convolution_backward(
                grad_out, x, weight, [weight.shape[0]] if ctx.has_bias else None, [1, 1], list(ctx.padding),
                list(ctx.dilation), False, [0, 0], 1, [need_x, False, need_b])
        if need_w:
            grad_w = tap_weight_grad(x, grad_out, tuple(weight.shape[2:]), ctx.dilation, ctx.padding, weight)
        return grad_x, grad_w, grad_b, None, None


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts a convolution to on ``device_type``, or None when it is off."""
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def dilated_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple[int, int],
                   padding: tuple[int, int], dilation: tuple[int, int], groups: int, wgrad: str = "aten") -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups)``; with ``wgrad="taps"`` a
    stride-1, one-group call whose valid share is at most :data:`TAPS_MAX_FRACTION` takes its
    weight gradient from per-tap GEMMs (module doc). x [N, C, H, W] -> [N, O, Ho, Wo]."""
    taps = (wgrad == "taps" and groups == 1 and tuple(stride) == (1, 1) and x.dim() == 4
            and torch.is_grad_enabled() and weight.requires_grad
            and valid_fraction(tuple(x.shape[2:]), tuple(weight.shape[2:]), dilation, padding) <= TAPS_MAX_FRACTION)
    if not taps:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    dtype = _autocast_dtype(x.device.type)
    if dtype is not None:                 # cast as autocast casts a convolution; run the op without it
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            return _TapWgradConv.apply(x, weight, bias, tuple(padding), tuple(dilation))
    return _TapWgradConv.apply(x, weight, bias, tuple(padding), tuple(dilation))
