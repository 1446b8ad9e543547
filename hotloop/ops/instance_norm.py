"""Instance normalisation of a channels-last map without layout copies (``Strategy.instance_norm``).

``F.instance_norm`` views a ``[B, C, H, W]`` map as ``[1, B*C, H, W]`` and batch-normalises that.
The view exists only for a contiguous (NCHW) map: a channels-last map is first copied to NCHW, the
result copied back, and the backward copies the same way, three map-sized copies per call on
top of the normalisation. ``"per_sample"`` normalises each sample of a channels-last map with
aten's channels-last batch-norm kernel (a sample's per-channel statistics over ``H, W`` are its
instance statistics), writing into one output in the map's own layout; its backward runs aten's
batch-norm backward per sample. The statistics and the normalisation are those of batch norm in
another summation order: fp32 results differ from ``"aten"`` by rounding
(``tests/ops/test_instance_norm.py`` states the tolerance). A contiguous map, an unbatched one,
an affine or running-statistics norm, and a call under ``torch.compile`` take ``"aten"``.

A batch of one is batch norm itself, and either value computes it with ``F.batch_norm``: on a
``[1, C, H, W]`` map ``F.instance_norm`` returns a wrong input gradient (torch 2.13, CPU) when the
upstream gradient is channels-last, as it is in a channels-last model; batch norm's own backward
handles either layout. On a contiguous map this is the call ``F.instance_norm`` makes, bitwise.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["INSTANCE_NORMS", "instance_norm2d", "stored_channels_last"]

#: ``Strategy.instance_norm`` values: aten's instance norm, or per-sample batch norm in channels-last
INSTANCE_NORMS = ("aten", "per_sample")

_aten = torch.ops.aten


def stored_channels_last(x: Tensor) -> bool:
    """Whether ``x`` [B, C, H, W] is stored channels-last (and not also contiguous)."""
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


class _PerSampleNorm(torch.autograd.Function):
    """Instance norm of a channels-last ``x`` [B, C, H, W]: aten's batch norm of each sample."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, eps: float) -> Tensor:
        y = torch.empty_like(x, memory_format=torch.channels_last)        # [B, C, H, W], channels-last
        mean = x.new_empty(x.shape[:2])               # [B, C], the map's dtype as aten's kernel keeps it
        invstd = torch.empty_like(mean)                                   # [B, C]
        for i in range(x.shape[0]):
            _aten.native_batch_norm.out(x[i:i + 1], None, None, None, None, True, 0.0, eps,
                                        out=y[i:i + 1], save_mean=mean[i], save_invstd=invstd[i])
        ctx.save_for_backward(x, mean, invstd)        # the input, not y: a later in-place op may change y
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor, None]:
        x, mean, invstd = ctx.saved_tensors
        grad_y = grad_y.contiguous(memory_format=torch.channels_last)
        grad_x = torch.empty_like(x, memory_format=torch.channels_last)   # [B, C, H, W]
        for i in range(x.shape[0]):
            sample, _, _ = _aten.native_batch_norm_backward(grad_y[i:i + 1], x[i:i + 1], None, None, None,
                                                            mean[i], invstd[i], True, ctx.eps,
                                                            [True, False, False])
            grad_x[i:i + 1].copy_(sample)
        return grad_x, None


def instance_norm2d(x: Tensor, eps: float = 1e-5, impl: str = "aten") -> Tensor:
    """Instance norm (no affine, no running statistics) of ``x`` [B, C, H, W] per ``impl``
    (one of :data:`INSTANCE_NORMS`; module doc)."""
    if impl not in INSTANCE_NORMS:
        raise ValueError(f"instance_norm={impl!r}; choose one of {list(INSTANCE_NORMS)}")
    if x.dim() == 4 and x.shape[0] == 1:              # one sample: its instance norm is its batch norm
        return F.batch_norm(x, None, None, training=True, momentum=0.0, eps=eps)
    if (impl == "per_sample" and x.dim() == 4 and x.shape[0] > 0 and stored_channels_last(x)
            and not torch.compiler.is_compiling()):
        return _PerSampleNorm.apply(x, eps)
    return F.instance_norm(x, eps=eps)
