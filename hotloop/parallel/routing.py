"""Route a model's training calls through ``DistributedDataParallel``.

DDP synchronises gradients only for work done inside its ``forward``. Models
here are called as ``model.loss(batch, state)`` (and ``model(batch, state)``
inside it), so instead of changing every caller we wrap the model in DDP and
patch the *instance's* ``forward`` and ``loss`` so that the outermost call in
training mode goes through ``ddp(...)``. Calls nested inside it, and any call
under ``torch.no_grad()`` or in eval mode (evaluation, decoding), run the
model directly with no communication. The model object, its parameter names
and its ``state_dict`` stay unchanged.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["RoutedModel", "route_through_ddp", "ROUTED_METHODS"]

ROUTED_METHODS = ("forward", "loss")


class _MethodAdapter(nn.Module):
    """The module DDP wraps: ``forward(name, *args)`` runs the model class's method ``name``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(type(self.model), method)(self.model, *args, **kwargs)


class RoutedModel:
    """Keeps the DDP wrapper of a model and the routing flag (not an ``nn.Module``)."""

    def __init__(self, model: nn.Module, ddp: DistributedDataParallel) -> None:
        self.model = model
        self.ddp = ddp
        self.inside = False

    def method(self, name: str) -> Callable[..., Any]:
        unbound = getattr(type(self.model), name)
        model = self.model

        def routed(*args: Any, **kwargs: Any) -> Any:
            if self.inside or not (model.training and torch.is_grad_enabled()):
                return unbound(model, *args, **kwargs)
            self.inside = True
            try:
                return self.ddp(name, *args, **kwargs)
            finally:
                self.inside = False

        routed.__name__ = name
        routed.__doc__ = unbound.__doc__
        return routed

    def __deepcopy__(self, memo: dict) -> "RoutedModel":
        # A copy would keep calling the original model through the original DDP wrapper.
        raise TypeError("a model wrapped for data parallel cannot be deep-copied; copy it before "
                        "ProcessGroupContext.wrap() or after ProcessGroupContext.close()")

    def no_sync(self) -> Any:
        """Context manager: backward inside it accumulates gradients locally (no communication)."""
        return self.ddp.no_sync()

    def unpatch(self) -> None:
        for name in ROUTED_METHODS:
            self.model.__dict__.pop(name, None)
        self.model.__dict__.pop("_hotloop_routed", None)


def route_through_ddp(model: nn.Module, **ddp_kwargs: Any) -> RoutedModel:
    """Wrap ``model`` in DDP (``ddp_kwargs`` go to its constructor) and patch its methods in place."""
    if "_hotloop_routed" in model.__dict__:
        raise ValueError("this model is already wrapped for data parallel")
    ddp = DistributedDataParallel(_MethodAdapter(model), **ddp_kwargs)
    routed = RoutedModel(model, ddp)
    for name in ROUTED_METHODS:
        if callable(getattr(type(model), name, None)):
            model.__dict__[name] = routed.method(name)  # instance attribute shadows the class method
    model.__dict__["_hotloop_routed"] = routed
    return routed
