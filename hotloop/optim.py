"""Registered optimizers (the learning-rate schedules are in :mod:`hotloop.schedules`).

An optimizer factory is ``fn(params, hp, fused) -> torch.optim.Optimizer``;
``fused=True`` selects multi-tensor kernels (``foreach``, or ``fused`` where
the build supports it for the parameters' device).
"""
from __future__ import annotations

import inspect
from typing import Iterable

import torch

from .errors import StrategyError
from .hparams import HParams
from .registry import optimizers

__all__ = ["build_optimizer", "sparse_gradient_modules", "fused_kernel_available"]


def fused_kernel_available(optimizer_cls: type, params: Iterable[torch.Tensor]) -> bool:
    """torch has a one-kernel (``fused=True``) update for ``optimizer_cls`` over ``params``
    (dense floating-point tensors on a device torch has fused kernels for)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    try:
        accepts = "fused" in inspect.signature(optimizer_cls.__init__).parameters
    except (TypeError, ValueError):
        return False
    params = list(params)
    devices = _get_fused_kernels_supported_devices()
    return accepts and bool(params) and all(
        p.is_floating_point() and not p.is_sparse and p.device.type in devices for p in params)


def _multi_tensor(params: list, fused: bool) -> dict[str, bool]:
    """``fused`` kernels on CUDA; ``foreach`` (multi-tensor) elsewhere; per-tensor loop if off.
    ``params`` are parameters or param groups (dicts with ``"params"``)."""
    if not fused:
        return {"foreach": False}
    on_cuda = any(p.is_cuda for item in params
                  for p in (item["params"] if isinstance(item, dict) else [item]))
    return {"fused": True} if on_cuda else {"foreach": True}


@optimizers.register("sgd")
def sgd(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=hp.learning_rate, weight_decay=hp.weight_decay,
                           **_multi_tensor(params, fused))


@optimizers.register("momentum")
def momentum(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=hp.learning_rate, momentum=hp.momentum,
                           weight_decay=hp.weight_decay, **_multi_tensor(params, fused))


@optimizers.register("adam")
def adam(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=hp.learning_rate, betas=(hp.adam_beta1, hp.adam_beta2),
                            eps=hp.adam_epsilon, weight_decay=hp.weight_decay,
                            **_multi_tensor(params, fused))


@optimizers.register("adamw")
def adamw(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=hp.learning_rate, betas=(hp.adam_beta1, hp.adam_beta2),
                             eps=hp.adam_epsilon, weight_decay=hp.weight_decay,
                             **_multi_tensor(params, fused))


def sparse_gradient_modules(model: torch.nn.Module) -> list[str]:
    """Names of modules that produce sparse gradients (``Embedding``/``EmbeddingBag(sparse=True)``)."""
    return [name or type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse]


def build_optimizer(params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], hp: HParams, *,
                    fused: bool = True, sparse: bool = False) -> torch.optim.Optimizer:
    """``hp.optimizer`` over ``params``: parameters, or param groups (:mod:`hotloop.param_groups`)
    whose own settings (``weight_decay``, ``lr``, ``lr_scale``) override the hparams'."""
    items = list(params)
    if items and isinstance(items[0], dict):
        groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in items]
        params = [g for g in groups if g["params"]]
    else:
        params = [p for p in items if p.requires_grad]
    if fused and sparse:
        raise StrategyError("fused_optimizer=True cannot update sparse gradients; "
                            "set fused_optimizer=False or use dense embeddings")
    return optimizers.get(hp.optimizer)(params, hp, fused)
