"""Single-file checkpoints of an FSDP-sharded model and optimizer (``torch.distributed.checkpoint.state_dict``).

The model's and optimizer's states go through ``get_model_state_dict`` /
``get_optimizer_state_dict`` with ``StateDictOptions(full_state_dict=True,
cpu_offload=True)``: a collective every rank calls, after which rank 0 holds the full,
unsharded state on the CPU (other ranks get ``{}``). Loading gives every rank the full
state and ``set_model_state_dict`` / ``set_optimizer_state_dict`` keep its shard.

The optimizer state is kept in torch's own layout (parameters numbered in the order of
the optimizer's groups, as ``Optimizer.state_dict()`` gives it), not torch.distributed's
parameter-name layout, so a checkpoint of an FSDP run resumes under DDP, ZeRO-1 or one
process, and the other way round.

``torch.distributed.checkpoint.state_dict`` and ``torch.distributed.tensor`` are imported by the
functions that use them, so a single-process run,
which imports this module through the checkpoint code, does not pay for them; no parameter can be a
``DTensor`` before ``torch.distributed.tensor`` is imported, which :func:`is_sharded` relies on.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

__all__ = ["is_sharded", "full_model_state", "load_full_model_state", "full_optimizer_state",
           "load_full_optimizer_state"]


def _full_state(on_rank0_cpu: bool) -> Any:
    """``StateDictOptions`` of the full state: gathered on rank 0's CPU (what a single-file checkpoint
    holds), or given on every rank (loading)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=on_rank0_cpu)


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (sharded by FSDP)."""
    dtensor_module = sys.modules.get("torch.distributed.tensor")    # not imported: no DTensor exists
    return dtensor_module is not None and any(isinstance(p, dtensor_module.DTensor) for p in model.parameters())


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """Collective: the full model ``state_dict`` on rank 0 (CPU tensors), ``{}`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(model, options=_full_state(True))


def load_full_model_state(model: nn.Module, state: dict[str, Any]) -> None:
    """Load a full (unsharded) model ``state_dict`` given on every rank; each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    set_model_state_dict(model, state, options=_full_state(False))


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of each optimizer slot, in group order."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: the full optimizer ``state_dict`` (torch's numbered layout) on rank 0, ``{}`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    by_name = get_optimizer_state_dict(model, optimizer, options=_full_state(True))
    if not by_name:
        return {}
    index = {name: i for i, name in enumerate(_names(model, optimizer))}
    state = {index[name]: value for name, value in by_name["state"].items()}
    groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": [index[n] for n in group["params"]]}
              for group in by_name["param_groups"]]
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full optimizer ``state_dict`` (torch's numbered layout, given on every rank); each
    rank keeps its shard. Raises ``ValueError`` when the groups do not fit."""
    names = _names(model, optimizer)
    groups = state.get("param_groups")
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if not isinstance(groups, list) or [len(g.get("params", ())) for g in groups] != sizes:
        raise ValueError(f"the saved parameter groups do not match this optimizer's (sizes {sizes})")
    by_name = {"state": {names[int(i)]: value for i, value in state.get("state", {}).items()},
               "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                 "params": [names[int(i)] for i in g["params"]]} for g in groups]}
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, by_name, options=_full_state(False))
