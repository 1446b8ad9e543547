"""A one-kernel optimizer update over parameters laid out densely but not contiguously, in storage order.

torch's one-kernel update (``fused=True``) takes contiguous tensors: given a ``channels_last``
convolution weight it makes contiguous copies of the parameter, its gradient and its state, updates
them and copies them back, every step. Every fused update torch has (Adam, AdamW, SGD, Adagrad) is
elementwise, so it gives the same numbers on any one order of the elements, as long as the
parameter, gradient and state are read in that same order. A dense tensor's storage is such an
order: :func:`in_storage_order` hands the optimizer, for the duration of one ``step()``, 1-D views
of those tensors' storage in place of each such parameter (its gradient and state viewed the same
way), so the kernel updates them where they lie. Outside the step the optimizer holds the model's
parameters and state of the parameters' own shape and layout, as always: ``state_dict()``,
checkpoints, learning-rate schedules and clipping see nothing different.

A gradient or state tensor in another layout than its parameter (state loaded from a checkpoint
written in another layout) is laid out like the parameter first, and kept so; torch's own kernel,
given a ``channels_last`` weight and a contiguous gradient, pairs their elements wrongly (torch
2.13). Only groups built with ``fused=True`` of a plain torch optimizer are changed, and only plain
tensors (not an FSDP shard's ``DTensor``). ``benchmarks/update_layout.py`` times the two updates
on the zoo's conv nets (``docs/data/update_layout.json``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor

__all__ = ["storage_view", "in_storage_order"]


def _is_dense(t: Tensor) -> bool:
    """Whether ``t``'s elements fill ``t.numel()`` consecutive storage slots (any dimension order)."""
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(t.shape, t.stride()) if s != 1),
                               key=lambda pair: pair[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def storage_view(t: Tensor) -> Tensor | None:
    """A 1-D view of ``t``'s elements in storage order when ``t`` is dense but not contiguous, else None."""
    if t.is_contiguous() or type(t) not in (Tensor, torch.nn.Parameter) or not _is_dense(t):
        return None
    return t.detach().as_strided((t.numel(),), (1,))


def _laid_out_as(param: Tensor, t: Tensor) -> Tensor:
    """``t`` (``param``'s shape) in ``param``'s strides: itself, or a copy laid out so."""
    if t.stride() == param.stride():
        return t
    return torch.empty_strided(param.shape, param.stride(), dtype=t.dtype, device=t.device).copy_(t)


class _Swap:
    """One parameter swapped for its storage view while the optimizer steps."""

    def __init__(self, param: Tensor, flat: Tensor) -> None:
        self.param, self.flat = param, flat

    def enter(self, state: dict[Any, Any]) -> None:
        p, flat = self.param, self.flat
        if p.grad is not None:
            p.grad = _laid_out_as(p, p.grad)
            flat.grad = p.grad.as_strided((p.numel(),), (1,))
        own = state.pop(p, None)
        if own is not None:
            for key, value in own.items():
                if isinstance(value, Tensor) and value.shape == p.shape:
                    own[key] = _laid_out_as(p, value).as_strided((p.numel(),), (1,))
            state[flat] = own

    def exit(self, state: dict[Any, Any]) -> None:
        p, flat = self.param, self.flat
        flat.grad = None
        own = state.pop(flat, None)
        if own is not None:
            for key, value in own.items():
                if isinstance(value, Tensor) and value.dim() == 1 and value.numel() == p.numel():
                    own[key] = value.as_strided(p.shape, p.stride())
            state[p] = own


def _swaps(optimizer: torch.optim.Optimizer) -> list[tuple[dict[str, Any], int, _Swap]]:
    swaps = []
    for group in getattr(optimizer, "param_groups", None) or []:
        if not isinstance(group, dict) or not group.get("fused"):
            continue
        for i, p in enumerate(group["params"]):
            flat = storage_view(p)
            if flat is not None:
                swaps.append((group, i, _Swap(p, flat)))
    return swaps


@contextlib.contextmanager
def in_storage_order(optimizer: Any) -> Iterator[None]:
    """While the block runs (one ``optimizer.step()``), ``optimizer``'s fused groups hold storage views
    of their dense non-contiguous parameters, with gradients and state viewed alike (module doc)."""
    # a wrapper that steps an inner optimizer of its own (ZeRO's ``.optim``) is left as it is
    plain = isinstance(optimizer, torch.optim.Optimizer) and not hasattr(optimizer, "optim")
    swaps = _swaps(optimizer) if plain else []
    if not swaps:
        yield
        return
    state = optimizer.state
    for group, i, swap in swaps:
        swap.enter(state)
        group["params"][i] = swap.flat
    try:
        yield
    finally:
        for group, i, swap in swaps:
            group["params"][i] = swap.param
            swap.exit(state)
