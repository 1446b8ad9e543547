"""Route a model's calls through a wrapper module (``DistributedDataParallel``, an FSDP root).

DDP synchronises gradients only for work done inside its ``forward``. Models
here are called as ``model.loss(batch, state)`` (and ``model(batch, state)``
inside it), so instead of changing every caller we wrap the model in DDP and
patch the *instance's* ``forward`` and ``loss`` so that the outermost call in
training mode goes through ``ddp(...)``. Calls nested inside it, and any call
under ``torch.no_grad()`` or in eval mode (evaluation, decoding), run the
model directly with no communication. The model object, its parameter names
and its ``state_dict`` stay unchanged. Under FSDP (``always=True``) every
outermost call goes through the wrapper, whose hooks gather the root's
parameters (:mod:`hotloop.parallel.fsdp`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["RoutedModel", "MethodAdapter", "route_through", "route_through_ddp", "check_unrouted",
           "ROUTED_METHODS"]

ROUTED_METHODS = ("forward", "loss")


class MethodAdapter(nn.Module):
    """The module DDP (or FSDP, as its root) wraps: ``forward(name, *args)`` runs the model class's method ``name``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(type(self.model), method)(self.model, *args, **kwargs)


class RoutedModel:
    """Keeps the wrapper of a model and the routing flag (not an ``nn.Module``).

    ``ddp`` is the module called (DDP, or the FSDP root); ``always``: route calls in eval mode
    and under ``no_grad`` too; ``no_sync``: the wrapper's gradient-accumulation context.
    """

    def __init__(self, model: nn.Module, ddp: nn.Module, *, always: bool = False,
                 no_sync: Callable[[], Any] | None = None) -> None:
        self.model = model
        self.ddp = ddp
        self.always = always
        self._no_sync = no_sync
        self.inside = False

    def method(self, name: str) -> Callable[..., Any]:
        unbound = getattr(type(self.model), name)
        model = self.model

        def routed(*args: Any, **kwargs: Any) -> Any:
            if self.inside or not (self.always or (model.training and torch.is_grad_enabled())):
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
        return self._no_sync() if self._no_sync is not None else self.ddp.no_sync()

    def unpatch(self) -> None:
        for name in ROUTED_METHODS:
            self.model.__dict__.pop(name, None)
        self.model.__dict__.pop("_hotloop_routed", None)


def route_through(routed: RoutedModel) -> RoutedModel:
    """Patch ``routed.model``'s methods in place so that they go through ``routed.ddp``."""
    model = routed.model
    for name in ROUTED_METHODS:
        if callable(getattr(type(model), name, None)):
            model.__dict__[name] = routed.method(name)  # instance attribute shadows the class method
    model.__dict__["_hotloop_routed"] = routed
    return routed


def check_unrouted(model: nn.Module) -> None:
    """Raise ``ValueError`` if ``model`` is already wrapped for data parallel."""
    if "_hotloop_routed" in model.__dict__:
        raise ValueError("this model is already wrapped for data parallel")


def route_through_ddp(model: nn.Module, **ddp_kwargs: Any) -> RoutedModel:
    """Wrap ``model`` in DDP (``ddp_kwargs`` go to its constructor) and patch its methods in place."""
    check_unrouted(model)
    return route_through(RoutedModel(model, DistributedDataParallel(MethodAdapter(model), **ddp_kwargs)))
