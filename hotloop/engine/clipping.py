"""Gradient clipping by global norm, and clipping folded into a plain SGD step.

:func:`clip_grad_norm` is ``torch.nn.utils.clip_grad_norm_`` (foreach), bitwise,
minus a no-op pass when the gradients live on the host.

:func:`clip_via_lr` gives the same update as clip-then-SGD without touching the
gradients: plain SGD (no momentum, no weight decay) moves ``p -= lr * (c * g)``,
which is ``p -= (lr * c) * g``, so the clip factor ``c`` goes into this step's
learning rate and the multiply over every gradient (one full read and write) is
not run. The two differ only in rounding (``lr * c`` is formed in double
precision). It needs the factor on the host, so it runs on CPU gradients only;
for any other optimizer, or gradients on an accelerator, the step clips the
gradients as usual (:func:`clip_via_lr_unavailable` says why).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["clip_grad_norm", "clip_via_lr", "clip_via_lr_unavailable", "plain"]


def plain(value: Tensor) -> Tensor:
    """A replicated ``DTensor`` (a norm over FSDP's sharded gradients) as the tensor each rank holds."""
    full = getattr(value, "full_tensor", None)          # only a DTensor has it
    return full() if callable(full) else value


def _norm_and_factor(params: Sequence[Tensor], max_norm: float) -> tuple[list[Tensor], Tensor, Tensor]:
    """(gradients, their global L2 norm, the clip factor ``min(1, max_norm / (norm + 1e-6))``),
    the norm and factor computed exactly as ``torch.nn.utils.clip_grad_norm_`` does."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    return grads, total, torch.clamp(max_norm / (total + 1e-6), max=1.0)


def clip_grad_norm(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (foreach), bitwise, minus a no-op pass on the host.

    torch always multiplies every gradient by ``min(1, max_norm / norm)`` so that no
    device sync is needed. When the gradients live in host memory, reading that
    coefficient costs nothing, and when it is exactly 1 the multiply (one full read
    and write of every gradient) is skipped: multiplying by 1.0 is the identity.
    """
    grads, total, factor = _norm_and_factor(params, max_norm)
    if all(g.device.type == "cpu" for g in grads) and bool(plain(factor) == 1.0):
        return plain(total)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return plain(total)


def _plain_sgd_problem(optimizer: torch.optim.Optimizer) -> str | None:
    if type(optimizer) is not torch.optim.SGD:
        return f"the optimizer is {type(optimizer).__name__}, not plain SGD"
    for i, group in enumerate(optimizer.param_groups):
        for key in ("momentum", "weight_decay"):
            if group.get(key, 0) != 0:
                return f"param_group[{i}] has {key}={group[key]} (plain SGD has none)"
        if group.get("maximize") or isinstance(group.get("lr"), Tensor):
            return f"param_group[{i}] maximizes or has a tensor learning rate"
    return None


def clip_via_lr_unavailable(optimizer: torch.optim.Optimizer, device: torch.device) -> str | None:
    """Why the clip cannot be folded into this step's update (None: it can)."""
    problem = _plain_sgd_problem(optimizer)
    if problem is not None:
        return problem
    if device.type != "cpu":
        return f"gradients on {device.type}: reading the clip factor would sync the host every step"
    return None


def clip_via_lr(optimizer: torch.optim.Optimizer, params: Sequence[Tensor], max_norm: float) -> Tensor:
    """Clip by global norm folded into ``optimizer.step()`` (plain SGD, CPU); returns the norm.

    Runs the optimizer step itself: with factor ``c = min(1, max_norm / (norm + 1e-6))``
    (computed as torch does), every group's learning rate is ``lr * c`` for this step only.
    """
    _, total, factor_tensor = _norm_and_factor(params, max_norm)
    factor = float(plain(factor_tensor))                        # CPU gradients: no device sync
    rates = [group["lr"] for group in optimizer.param_groups]
    if factor != 1.0:
        for group, lr in zip(optimizer.param_groups, rates):
            group["lr"] = lr * factor
    try:
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, rates):
            group["lr"] = lr
    return plain(total)
