"""Batch normalisation of a channels-last map with statistics summed in two passes
(``Strategy.batch_norm``).

aten's channels-last batch-norm kernel on a CPU sums each channel's statistics in fp32, one
row after another over all ``N*H*W`` positions. On a 2-core AMD EPYC Zen 3 (AVX2, torch
2.13) a ``[64, 64, 28, 28]`` map's mean comes out 1.5e-6 from its fp64 value (relative), its
variance 2.5e-6, and the input gradient 1.2e-6; the contiguous (NCHW) kernel gets 3.1e-8,
5.3e-8 and 7.2e-8. In a whole ``se_resnext_small`` step the parameter gradients land 3.3e-3 from
fp64 in channels-last and 1.1e-4 in NCHW; with this form in channels-last, 1.1e-4
(``benchmarks/batch_norm_accuracy.py``, ``docs/data/batch_norm_accuracy_zen3.json``).

``"two_pass"`` computes the same function from the map viewed as ``[N*H*W, C]``: the mean as a
column sum (aten's cascaded reduction), the variance from the centred values in a second
pass, the output as ``x * a + b`` per channel; its backward sums ``dy`` and ``dy * (x - mean)`` the
same way. Its errors match the NCHW kernel's (``tests/ops/test_batch_norm.py``). Training-mode
calls on a channels-last 4-D map take it; anything else (eval mode, a contiguous map, a call
under ``torch.compile``) takes ``F.batch_norm``, unchanged.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .instance_norm import stored_channels_last

__all__ = ["BATCH_NORMS", "batch_norm2d"]

#: ``Strategy.batch_norm`` values: aten's kernels, or two-pass statistics on channels-last maps
BATCH_NORMS = ("aten", "two_pass")


def _rows(x: Tensor) -> Tensor:
    """The ``[N*H*W, C]`` view of a channels-last ``x`` [N, C, H, W]."""
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


class _TwoPassBatchNorm(torch.autograd.Function):
    """Training-mode batch norm of a channels-last ``x`` [N, C, H, W] (module doc)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
                ) -> tuple[Tensor, Tensor, Tensor]:
        rows = _rows(x)                                                   # [M, C]
        count = rows.shape[0]
        mean = rows.sum(0).div_(count)                                    # [C]
        y = torch.empty_like(x, memory_format=torch.channels_last)        # [N, C, H, W]
        y_rows = _rows(y)                                                 # [M, C], a view of y
        var = torch.sub(rows, mean, out=y_rows).square_().sum(0).div_(count)   # [C], biased
        invstd = (var + eps).rsqrt_()
        scale = invstd if weight is None else invstd * weight
        shift = -mean * scale if bias is None else bias - mean * scale
        torch.addcmul(shift, rows, scale, out=y_rows)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        rows, count = _rows(x), x.numel() // x.shape[1]
        dy = _rows(grad_y.contiguous(memory_format=torch.channels_last))  # [M, C]
        sum_dy = dy.sum(0)                                                # [C]
        grad_x = torch.empty_like(x, memory_format=torch.channels_last)   # [N, C, H, W]
        work = _rows(grad_x)                                              # [M, C], a view of grad_x
        sum_dy_centred = torch.sub(rows, mean, out=work).mul_(dy).sum(0)  # [C]: sum dy * (x - mean)
        scale = invstd if weight is None else invstd * weight
        # dx = scale * (dy - sum_dy / M - (x - mean) * invstd^2 * sum_dy_centred / M)
        centred_coef = -scale * invstd * invstd * sum_dy_centred / count
        torch.sub(rows, mean, out=work).mul_(centred_coef).add_(-scale * sum_dy / count).addcmul_(dy, scale)
        grad_weight = sum_dy_centred * invstd if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None


def batch_norm2d(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                 weight: Tensor | None, bias: Tensor | None, training: bool, momentum: float,
                 eps: float, impl: str = "aten") -> Tensor:
    """``F.batch_norm`` of ``x`` [N, C, H, W] per ``impl`` (one of :data:`BATCH_NORMS`; module doc).
    Running statistics move like ``F.batch_norm``'s: by ``momentum``, the variance unbiased."""
    if impl not in BATCH_NORMS:
        raise ValueError(f"batch_norm={impl!r}; choose one of {list(BATCH_NORMS)}")
    count = x.numel() // x.shape[1] if x.dim() == 4 and x.shape[1] else 0
    if (impl == "aten" or not training or x.dim() != 4 or count < 2 or not stored_channels_last(x)
            or torch.compiler.is_compiling()):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    y, mean, var = _TwoPassBatchNorm.apply(x, weight, bias, eps)
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            running_var.lerp_((var * (count / (count - 1))).to(running_var.dtype), momentum)
    return y
