"""A linear layer's GEMMs through oneDNN (``Strategy.linear_gemm``).

On a CPU, ``F.linear`` and the two GEMMs of its backward call the BLAS torch is built with
(MKL's sgemm). oneDNN's convolution computes the same product when the rows of ``x`` are the
pixels of one channels-last map and the weight is a 1x1 kernel:
``x [M, K] @ weight.T [K, N] + bias`` is ``conv2d(x as [1, K, M, 1], weight as [N, K, 1, 1], bias)``,
with no copy of ``x``, the weight or the result. Its backward (oneDNN's data and weight gradients)
gives the two other GEMMs. oneDNN picks its kernels by the instructions it finds; where they are
wider than the BLAS's (MKL takes its generic path on the AMD EPYC with AVX-512 measured), the three GEMMs of a layer run
faster. ``"onednn"`` is the same sum in another order (fp32 rounding); autocast casts the
convolution as it casts a linear layer. Calls oneDNN does not serve (other devices, dtypes other
than fp32 and bf16, a weight not stored row by row, empty inputs) stay ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["LINEAR_GEMMS", "linear", "linear_grads", "onednn_serves"]

#: ``Strategy.linear_gemm`` values: the BLAS's GEMM (``F.linear``), or oneDNN's
LINEAR_GEMMS = ("aten", "onednn")
#: whether this torch has oneDNN (read once: a compiled step traces no call to ask it)
_HAS_ONEDNN = torch.backends.mkldnn.is_available()


def onednn_serves(x: Tensor, weight: Tensor) -> bool:
    """Whether oneDNN computes ``F.linear(x, weight)`` here (the module doc's conditions)."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.dtype == weight.dtype
            and weight.dim() == 2 and weight.is_contiguous() and x.dim() >= 1 and x.shape[-1] == weight.shape[1]
            and x.numel() > 0 and _HAS_ONEDNN)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, gemm: str = "aten") -> Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN's convolution when ``gemm="onednn"`` and it
    serves the call. x [..., K], weight [N, K], bias [N] -> [..., N]."""
    if gemm != "onednn" or not onednn_serves(x, weight):
        return F.linear(x, weight, bias)
    out = F.conv2d(_pixels(x), weight.view(*weight.shape, 1, 1), bias)      # [1, N, M, 1], channels-last
    return out.permute(0, 2, 3, 1).reshape(*x.shape[:-1], weight.shape[0])  # [..., N], a view


def linear_grads(grad_out: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """(``grad_out @ weight``, ``grad_out.T @ x``): the input and weight gradients of
    ``F.linear(x, weight)``, from oneDNN's convolution backward, without autograd.
    grad_out [M, N], x [M, K], weight [N, K] -> [M, K], [N, K]; the caller checks
    :func:`onednn_serves` for ``x`` and ``weight``."""
    grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
        _pixels(grad_out), _pixels(x), weight.view(*weight.shape, 1, 1), None, [1, 1], [0, 0], [1, 1],
        False, [0, 0], 1, [True, True, False])                               # [1, K, M, 1], [N, K, 1, 1]
    return grad_x.permute(0, 2, 3, 1).reshape(x.shape), grad_w.view(weight.shape)


def _pixels(rows: Tensor) -> Tensor:
    """[..., K] -> [1, K, M, 1]: the rows as the pixels of one channels-last map (a view when the
    rows are dense)."""
    return rows.reshape(1, -1, 1, rows.shape[-1]).permute(0, 3, 1, 2)

