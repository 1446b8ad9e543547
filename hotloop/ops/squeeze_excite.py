"""The squeeze-excitation gate ``x * sigmoid(expand(relu(reduce(mean_hw(x)))))`` with a backward of
fewer passes over ``x``-sized tensors.

The gate's inputs are feature maps, its excitation path works on ``[B, C, 1, 1]``. Autograd's
backward of the plain formula (``se_backward="aten"``) writes ``g * s`` for the product, the mean's
expanded gradient for the pool, and their sum: three map-sized writes besides ``g * x`` for the
gate's own gradient. On maps larger than the cache, memory traffic is the cost. ``"fused"`` keeps
the same forward ops and links two autograd functions: the product's backward computes the
gate's gradient ``sum_hw(g * x)`` and leaves ``x``'s gradient to the pool, whose backward (which
runs after it, since the gate is computed from the pool) writes ``g * s`` once and adds the mean's
gradient ``dm / (H W)`` into it in place. The numbers are the ones autograd computes for the plain
formula, in the same order (the sum of two addends is the same either way round), so the results
are bitwise equal in fp32 and under autocast (``tests/ops/test_squeeze_excite.py``).

Under ``torch.compile`` the plain formula is used (the compiler fuses it itself).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SE_BACKWARDS", "squeeze_excite"]

#: ``se_backward`` values: autograd's backward of the plain formula, or the linked one (module doc)
SE_BACKWARDS = ("aten", "fused")


class _Link:
    """What the product's backward hands to the pool's: the incoming gradient and the gate."""

    __slots__ = ("grad", "gate")

    def __init__(self) -> None:
        self.grad: Tensor | None = None
        self.gate: Tensor | None = None


class _Pool(torch.autograd.Function):
    """``mean_hw(x)``; its backward returns ``x``'s whole gradient (the product's part included)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, link: _Link) -> Tensor:       # x [B, C, H, W] -> [B, C, 1, 1]
        ctx.link, ctx.positions = link, x.shape[2] * x.shape[3]
        return x.mean(dim=(2, 3), keepdim=True)

    @staticmethod
    def backward(ctx: Any, grad_mean: Tensor) -> tuple[Tensor | None, None]:
        link = ctx.link
        grad, gate = link.grad, link.gate
        link.grad = link.gate = None
        if grad is None or gate is None:       # the product's gradient did not reach x: the mean's alone
            raise RuntimeError("squeeze_excite: the gate's backward did not run before the pool's")
        grad_x = torch.mul(grad, gate)                           # [B, C, H, W]: g * s
        grad_x.add_(grad_mean / ctx.positions)                   # + dm / (H W), broadcast over H, W
        return grad_x, None


class _Gate(torch.autograd.Function):
    """``x * gate``; its backward returns the gate's gradient and leaves ``x``'s to :class:`_Pool`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gate: Tensor, link: _Link) -> Tensor:   # [B,C,H,W] * [B,C,1,1]
        ctx.save_for_backward(x, gate)
        ctx.link = link
        return x * gate

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:
        x, gate = ctx.saved_tensors
        grad_gate = (grad * x).sum(dim=(2, 3), keepdim=True)        # [B, C, 1, 1]
        ctx.link.grad, ctx.link.gate = grad, gate
        return None, grad_gate, None


def _excite(pooled: Tensor, reduce: nn.Module, expand: nn.Module) -> Tensor:
    return torch.sigmoid(expand(torch.relu(reduce(pooled))))      # [B, C, 1, 1]


def squeeze_excite(x: Tensor, reduce: nn.Module, expand: nn.Module, se_backward: str = "aten") -> Tensor:
    """``x * sigmoid(expand(relu(reduce(mean_hw(x)))))`` for ``x`` ``[B, C, H, W]``; ``reduce`` and
    ``expand`` map ``[B, C, 1, 1]`` to ``[B, C/r, 1, 1]`` and back. ``se_backward`` (module doc)
    chooses how the backward runs; the values are the same."""
    if se_backward not in SE_BACKWARDS:
        raise ValueError(f"se_backward={se_backward!r}; choose one of {list(SE_BACKWARDS)}")
    linked = (se_backward == "fused" and torch.is_grad_enabled() and x.requires_grad
              and not torch.compiler.is_compiling())
    if not linked:
        return x * _excite(x.mean(dim=(2, 3), keepdim=True), reduce, expand)
    link = _Link()
    gate = _excite(_Pool.apply(x, link), reduce, expand)    # requires grad: x does
    return _Gate.apply(x, gate, link)
