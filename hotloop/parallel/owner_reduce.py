"""Reduce mode's gradient path: a DDP communication hook that reduces to owners.

DDP still buckets the gradients (``bucket_cap_mb``) and launches each
bucket's communication as soon as the bucket is ready, overlapping backward.
This hook replaces the bucket's all-reduce with ``dist.reduce`` of each
owner's contiguous segment to that owner (ownership is contiguous in
parameter order, so a bucket has one or a few segments). The owner divides
its segments by the world size and so holds the exact averaged gradient of
the parameters it updates.

Global-norm clipping needs the norm of *all* gradients, but a rank only has
the averaged gradients it owns. At the end of backward every owner computes
the per-parameter norms of its gradients, one small all-reduce shares them,
and each rank writes into every gradient it does not own a *norm proxy*: a
tensor of zeros whose first element is that parameter's norm. Any global-norm
computation (``clip_grad_norm_`` in the step, a grad-norm log) then gives the
same value on every rank as over the true averaged gradients, and a NaN/inf
anywhere reaches every rank. Non-owned gradients are never used to update.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["OwnerReduce", "register_owner_reduce"]


class OwnerReduce:
    """Hook state: who owns each parameter, plus the reductions in flight this backward."""

    def __init__(self, params: list[Tensor], owners: list[int], rank: int, world_size: int,
                 group: Any = None) -> None:
        self.params = params
        self.owners = owners
        self.owner_of = {id(p): o for p, o in zip(params, owners)}
        self.rank, self.world_size, self.group = rank, world_size, group
        self.pending: list[torch.futures.Future] = []
        self.finish_queued = False

    def segments(self, bucket: "dist.GradBucket") -> list[tuple[int, int, int]]:
        """``[(start, end, owner)]`` element ranges of the bucket's flat buffer, one per owner run."""
        base = bucket.buffer().storage_offset()
        out: list[tuple[int, int, int]] = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            start = grad.storage_offset() - base
            end, owner = start + grad.numel(), self.owner_of[id(param)]
            if out and out[-1][2] == owner and out[-1][1] == start:
                out[-1] = (out[-1][0], end, owner)
            else:
                out.append((start, end, owner))
        return out

    def hook(self, bucket: "dist.GradBucket") -> torch.futures.Future:
        buffer = bucket.buffer()                                    # [bucket numel], flat
        futures = [dist.reduce(buffer[start:end], dst=owner, group=self.group, async_op=True).get_future()
                   for start, end, owner in self.segments(bucket)]
        self.pending.extend(futures)
        if not self.finish_queued:  # runs once at the end of this backward, before DDP finalises
            self.finish_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)
        return torch.futures.collect_all(futures).then(lambda _: buffer)

    @torch.no_grad()
    def finish(self) -> None:
        """Wait for the reductions, average owned gradients, write norm proxies into the others."""
        torch.futures.wait_all(self.pending)
        self.pending, self.finish_queued = [], False
        grads = [p.grad for p in self.params]
        owned = [i for i, (g, o) in enumerate(zip(grads, self.owners)) if g is not None and o == self.rank]
        others = [i for i, (g, o) in enumerate(zip(grads, self.owners)) if g is not None and o != self.rank]
        device = self.params[0].device
        norms = torch.zeros(len(self.params), dtype=torch.float32, device=device)   # [num params]
        if owned:
            owned_grads = [grads[i] for i in owned]
            torch._foreach_div_(owned_grads, float(self.world_size))
            owned_norms = torch._foreach_norm(owned_grads)
            norms[owned] = torch.stack(owned_norms).to(torch.float32)
        dist.all_reduce(norms, group=self.group)   # each entry is non-zero on its owner only
        for i in others:
            proxy = grads[i].view(-1)
            proxy.zero_()
            proxy[0] = norms[i]


def register_owner_reduce(ddp: Any, params: list[Tensor], owners: list[int], rank: int,
                          world_size: int, group: Any = None) -> OwnerReduce:
    """Install the reduce-to-owner communication hook on a DDP module."""
    state = OwnerReduce(params, owners, rank, world_size, group)
    ddp.register_comm_hook(state, _hook)
    return state


def _hook(state, bucket):  # unannotated: DDP rejects string annotations (this module uses PEP 563)
    """DDP communication hook ``(state, GradBucket) -> Future[Tensor]``."""
    return state.hook(bucket)
