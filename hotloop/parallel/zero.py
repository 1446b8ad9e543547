"""``data_parallel=reduce``: ZeRO stage 1 on torch's ``ZeroRedundancyOptimizer``, over DDP.

DDP all-reduces the gradients (fused buckets of ``bucket_mb``, overlapping backward), so every
rank holds every averaged gradient: global-norm clipping and the non-finite check see the same
values on every rank. ``ZeroRedundancyOptimizer`` partitions the parameters over the ranks (by
size), keeps a local optimizer of the wrapped class over this rank's partition only, so
optimizer state per rank shrinks about N-fold, and broadcasts the updated parameters
(``parameters_as_bucket_view=True``: one collective per rank's bucket). The trainer's
``param_groups[i]["lr"]`` (and ``lr_scale``) writes reach the local optimizer at each step.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor
from torch.distributed.optim import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer", "zero_optimizer", "optimizer_state_bytes", "local_optimizer"]


def zero_optimizer(optimizer: torch.optim.Optimizer, group: Any = None) -> ZeroRedundancyOptimizer:
    """A ``ZeroRedundancyOptimizer`` of ``optimizer``'s class, groups and defaults (a fresh one)."""
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    groups = [dict(g) for g in optimizer.param_groups]
    prior = optimizer.state_dict() if optimizer.state else None
    zero = ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=group,
                                   parameters_as_bucket_view=True, **defaults)
    if prior is not None:
        zero.load_state_dict(prior)
    return zero


def local_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state (ZeRO's local one, else ``optimizer``)."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors this rank keeps in optimizer state (a ZeRO or FSDP shard counts its part)."""
    local = local_optimizer(optimizer)
    total = 0
    for state in local.state.values():
        for value in state.values():
            if isinstance(value, Tensor):
                tensor = value.to_local() if hasattr(value, "to_local") else value
                total += tensor.numel() * tensor.element_size()
    return total
