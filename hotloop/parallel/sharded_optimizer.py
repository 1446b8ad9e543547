"""Reduce mode's optimizer: each rank owns a contiguous shard of the parameters.

Paddle's *Reduce* strategy (ZeRO stage 1): parameter ``i`` has one owner rank;
only the owner keeps its optimizer state and updates it; the updated
parameters are then broadcast from their owners. Parameters are re-laid out
as views into per-owner flat buffers (at most ``bucket_mb`` each), so the
broadcast is one fused collective per bucket (Paddle's fuse_broadcast_ops;
``ZeroRedundancyOptimizer(parameters_as_bucket_view=True)`` does the same).

Ownership is contiguous in parameter order (see :func:`contiguous_owners`) so
that a DDP gradient bucket maps to few owner segments (the reduce-to-owner
hook in :mod:`hotloop.parallel.owner_reduce` relies on it).

The global ``param_groups`` are the wrapped optimizer's: a trainer that sets
``group["lr"]`` each step works unchanged; hyper-parameters are copied to the
local shard optimizer before every step.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from .errors import ShardedStateError

__all__ = ["ShardedOptimizer", "contiguous_owners", "optimizer_state_bytes"]


def contiguous_owners(sizes: list[int], world_size: int) -> list[int]:
    """Owner rank of each parameter: contiguous runs balanced by element count.

    A parameter goes to the rank whose equal share ``[r T/N, (r+1) T/N)`` of the
    total ``T`` elements holds the parameter's midpoint.
    """
    total = sum(sizes)
    owners, seen = [], 0
    for size in sizes:
        middle = seen + size / 2
        owners.append(min(world_size - 1, int(middle * world_size // total)) if total else 0)
        seen += size
    return owners


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of tensors held in this process's optimizer state (a Reduce shard counts its shard only)."""
    local = optimizer.local if isinstance(optimizer, ShardedOptimizer) else optimizer
    if local is None:
        return 0
    return sum(v.numel() * v.element_size() for state in local.state.values()
               for v in state.values() if isinstance(v, Tensor))


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _construct(cls: type, groups: list[dict[str, Any]], defaults: dict[str, Any]) -> torch.optim.Optimizer:
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in defaults.items() if k in accepted}
    return cls(groups, **kwargs)


class ShardedOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` (any ``torch.optim`` class): keep and update only this rank's shard.

    ``state_dict()`` is only available after :meth:`consolidated_state_dict`
    (a collective every rank must call); ``load_state_dict`` takes a full,
    unsharded state dict (from any world size) and keeps this rank's part.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, rank: int, world_size: int,
                 bucket_mb: float = 25.0, group: Any = None) -> None:
        prior_state = optimizer.state_dict() if optimizer.state else None
        super().__init__([dict(g) for g in optimizer.param_groups], dict(optimizer.defaults))
        self.wrapped_class = type(optimizer)
        self.rank, self.world_size, self.process_group = rank, world_size, group
        self.all_params: list[Tensor] = [p for g in self.param_groups for p in g["params"]]
        self.owners = contiguous_owners([p.numel() for p in self.all_params], world_size)
        owner_of = {id(p): o for p, o in zip(self.all_params, self.owners)}
        self.local_to_global: list[int] = []
        self._local_group_of: list[int] = []     # global group index of each local group
        local_groups = []
        index = 0
        for gi, group_ in enumerate(self.param_groups):
            mine = []
            for p in group_["params"]:
                if owner_of[id(p)] == rank:
                    mine.append(p)
                    self.local_to_global.append(index)
                index += 1
            if mine:
                local_groups.append({**_hyper(group_), "params": mine})
                self._local_group_of.append(gi)
        self.local: torch.optim.Optimizer | None = (
            _construct(self.wrapped_class, local_groups, self.defaults) if local_groups else None)
        self.buckets = self._flatten_into_buckets(int(bucket_mb * 2 ** 20))
        self._consolidated: dict[str, Any] | None = None
        if prior_state is not None:
            self.load_state_dict(prior_state)

    # -- parameter layout ---------------------------------------------------------------
    def _flatten_into_buckets(self, bucket_bytes: int) -> list[tuple[int, Tensor]]:
        """Make each owner's parameters views of flat buffers; return ``[(owner, flat)]``."""
        buckets: list[tuple[int, Tensor]] = []
        for owner in range(self.world_size):
            chunk: list[Tensor] = []
            size = 0
            mine = [p for p, o in zip(self.all_params, self.owners) if o == owner]
            for p in mine + [None]:  # type: ignore[list-item]
                boundary = p is None or (chunk and (
                    size + p.numel() * p.element_size() > bucket_bytes
                    or p.dtype != chunk[0].dtype or p.device != chunk[0].device))
                if boundary and chunk:
                    buckets.append((owner, self._flatten(chunk)))
                    chunk, size = [], 0
                if p is not None:
                    chunk.append(p)
                    size += p.numel() * p.element_size()
        return buckets

    @staticmethod
    def _flatten(params: list[Tensor]) -> Tensor:
        flat = torch.cat([p.detach().reshape(-1) for p in params])   # [sum numel]
        offset = 0
        with torch.no_grad():
            for p in params:
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        return flat

    # -- the update ---------------------------------------------------------------------
    def _sync_hyperparameters(self) -> None:
        if self.local is None:
            return
        for local_group, gi in zip(self.local.param_groups, self._local_group_of):
            local_group.update(_hyper(self.param_groups[gi]))

    @torch.no_grad()
    def broadcast_parameters(self) -> None:
        """Send every owner's updated parameters to all ranks (one collective per flat bucket)."""
        works = [dist.broadcast(flat, src=owner, group=self.process_group, async_op=True)
                 for owner, flat in self.buckets]
        for work in works:
            work.wait()

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        """Update this rank's shard, then broadcast the updated parameters."""
        if closure is not None:
            raise ShardedStateError("ShardedOptimizer.step does not take a closure")
        self._sync_hyperparameters()
        if self.local is not None:
            self.local.step()
        self._consolidated = None
        self.broadcast_parameters()
        return None

    # -- checkpoints ----------------------------------------------------------------------
    def consolidated_state_dict(self) -> dict[str, Any]:
        """Collective: the full optimizer state dict (global parameter indices) on every rank."""
        local = self.local.state_dict()["state"] if self.local is not None else {}
        mine = {self.local_to_global[li]: {k: v.detach().cpu() if isinstance(v, Tensor) else v
                                           for k, v in st.items()}
                for li, st in local.items()}
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.process_group)
        state: dict[int, Any] = {}
        for part in gathered:
            state.update(part)
        groups, index = [], 0
        for group_ in self.param_groups:
            n = len(group_["params"])
            groups.append({**_hyper(group_), "params": list(range(index, index + n))})
            index += n
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}
        return self._consolidated

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        if self._consolidated is None:
            raise ShardedStateError(
                "a Reduce-mode optimizer holds only this rank's shard; call "
                "ProcessGroupContext.consolidate_optimizer_state(optimizer) on EVERY rank to gather it")
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load a full (unsharded) state dict, from any world size; keep this rank's shard."""
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(mine["params"]) for g, mine in zip(groups, self.param_groups)):
            raise ShardedStateError(
                "optimizer state does not match the model's parameter groups "
                f"(expected sizes {[len(g['params']) for g in self.param_groups]})")
        for mine, saved in zip(self.param_groups, groups):
            mine.update(_hyper(saved))
        full_state = {int(k): v for k, v in state_dict.get("state", {}).items()}
        if self.local is None:
            return
        local_state = {li: full_state[g] for li, g in enumerate(self.local_to_global) if g in full_state}
        local_groups, li = [], 0
        for local_group, gi in zip(self.local.param_groups, self._local_group_of):
            n = len(local_group["params"])
            local_groups.append({**_hyper(self.param_groups[gi]), "params": list(range(li, li + n))})
            li += n
        self.local.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._consolidated = None
