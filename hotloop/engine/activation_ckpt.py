"""A model's blocks, and activation checkpointing on them (``Strategy.activation_checkpointing``).

:func:`block_units` names the modules that FSDP shards one by one and that activation
checkpointing recomputes: a model's own ``shard_units()`` when it has one, else every
member of an ``nn.ModuleList`` (transformer layers, residual stages, MLP blocks; the
outermost lists), else the top-level children that hold parameters. A candidate whose
parameters are tied to a module outside it (an embedding shared with an output
projection) is left to its parent.

:func:`set_activation_checkpointing` replaces each block instance's ``forward`` by
``torch.utils.checkpoint.checkpoint`` (non-reentrant, ``preserve_rng_state=True``) of the
original, so the block's activations are recomputed in backward with the same dropout
masks: results are bitwise those without it. Parameter names and ``state_dict`` stay the
same, and FSDP's hooks (on ``__call__``) wrap the checkpointed forward unchanged.
"""
from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["block_units", "set_activation_checkpointing", "checkpointed_blocks"]

_MARK = "_hotloop_checkpointed_forward"


def _tied_outside(model: nn.Module) -> dict[int, set[str]]:
    """Parameter id -> every name it has in ``model`` (a tied parameter has several)."""
    names: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), set()).add(name)
    return names


def _self_contained(prefix: str, module: nn.Module, names: dict[int, set[str]]) -> bool:
    """Whether every name of every parameter of ``module`` lies under ``prefix``."""
    for param in module.parameters():
        if any(not n.startswith(prefix + ".") for n in names.get(id(param), ())):
            return False
    return any(True for _ in module.parameters())


def block_units(model: nn.Module) -> list[nn.Module]:
    """The model's blocks, in module order (see the module doc); may be empty."""
    own = getattr(model, "shard_units", None)
    if callable(own):
        return list(own())
    names = _tied_outside(model)
    units: list[nn.Module] = []
    taken: list[str] = []
    for prefix, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or any(prefix.startswith(t + ".") for t in taken):
            continue
        for index, child in enumerate(module):
            child_prefix = f"{prefix}.{index}" if prefix else str(index)
            if _self_contained(child_prefix, child, names):
                units.append(child)
                taken.append(child_prefix)
    if units:
        return units
    return [child for name, child in model.named_children() if _self_contained(name, child, names)]


def checkpointed_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` whose forward is checkpointed now."""
    return [m for m in model.modules() if _MARK in m.__dict__]


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> list[nn.Module]:
    """Checkpoint each of :func:`block_units` (``enabled``) or undo it; returns the blocks checkpointed.

    Idempotent: a block already checkpointed keeps one wrapper.
    """
    for module in checkpointed_blocks(model):
        del module.__dict__["forward"]
        del module.__dict__[_MARK]
    if not enabled:
        return []
    blocks = block_units(model)
    for module in blocks:
        module.__dict__["forward"] = functools.partial(_checkpointed, module.forward)
        module.__dict__[_MARK] = True
    return blocks
