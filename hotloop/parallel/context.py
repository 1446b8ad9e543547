"""`ProcessGroupContext`: the Trainer's data-parallel hook over ``torch.distributed``.

Same interface as :class:`hotloop.train.context.LocalContext`:
``rank, world_size, is_main, wrap, shard_reader, all_reduce_stats, barrier,
consolidate_optimizer_state``. Modes (``Strategy.data_parallel``):

- ``"allreduce"``: DDP; gradients all-reduced in fused buckets of
  ``Strategy.bucket_mb`` while backward runs (Paddle's fuse_all_reduce_ops).
- ``"reduce"``: ZeRO stage 1: DDP, plus torch's ``ZeroRedundancyOptimizer``
  (each rank updates and keeps the optimizer state of its partition of the
  parameters, then broadcasts them; :mod:`hotloop.parallel.zero`).
- ``"fsdp"``: FSDP2: parameters, gradients and optimizer state sharded per
  block (:mod:`hotloop.parallel.fsdp`).

``"none"`` with more than one process means ``"allreduce"`` (ranks must
agree on the gradients).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .errors import LaunchError
from .fsdp import FSDPConfig, FSDPModel, shard_model
from .fsdp_state import full_optimizer_state, load_full_optimizer_state
from .group import init_process_group
from .routing import RoutedModel, route_through_ddp
from .sharding import ShardedReader
from .zero import ZeroRedundancyOptimizer, zero_optimizer

__all__ = ["ProcessGroupContext"]

log = logging.getLogger(__name__)

class ProcessGroupContext:
    """One rank of a data-parallel job (the default process group must be initialised)."""

    def __init__(self, mode: str = "allreduce", bucket_mb: float = 25.0, *,
                 find_unused_parameters: bool = False, group: Any = None,
                 fsdp: FSDPConfig | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise LaunchError("torch.distributed is not initialised; use ProcessGroupContext.from_env()")
        if mode not in ("none", "allreduce", "reduce", "fsdp"):
            raise LaunchError(f"data_parallel mode {mode!r}; choose allreduce, reduce or fsdp")
        self.mode = "allreduce" if mode == "none" else mode
        self.bucket_mb = float(bucket_mb)
        self.fsdp = fsdp or FSDPConfig()
        self.find_unused_parameters = find_unused_parameters
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.is_main = self.rank == 0
        self.backend = dist.get_backend(group)
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if self.backend == "nccl" else torch.device("cpu"))
        self.routed: RoutedModel | None = None

    @classmethod
    def from_env(cls, mode: str = "allreduce", bucket_mb: float = 25.0, *, backend: str | None = None,
                 timeout_s: float | None = None) -> "ProcessGroupContext":
        """Join the job described by ``torchrun``'s env vars (a worker of ``--nproc`` also ends
        when its launcher dies: :func:`~hotloop.parallel.launch.die_with_launcher`)."""
        from .launch import die_with_launcher
        die_with_launcher()
        init_process_group(backend, timeout_s)
        return cls(mode, bucket_mb)

    @classmethod
    def single_process(cls, mode: str = "fsdp", backend: str | None = None) -> "ProcessGroupContext":
        """A one-rank job in this process (an in-memory store; NCCL on CUDA), e.g. FSDP at world size 1."""
        from .group import default_backend
        if not dist.is_initialized():
            backend = backend or default_backend()
            if backend == "nccl":
                torch.cuda.set_device(torch.cuda.current_device())
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        return cls(mode)

    @classmethod
    def for_strategy(cls, strategy: Any) -> "ProcessGroupContext":
        """A context (in the already joined job) whose mode, bucket size and FSDP settings are ``strategy``'s."""
        return cls(strategy.data_parallel, strategy.bucket_mb,
                   fsdp=FSDPConfig(strategy.precision, strategy.reshard_after_forward))

    def broadcast_text(self, text: str | None) -> str:
        """The main rank's ``text`` on every rank (UTF-8 bytes in a tensor; nothing is unpickled)."""
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        if self.is_main:
            payload = torch.tensor(list((text or "").encode("utf-8")), dtype=torch.uint8, device=self.device)
            length[0] = payload.numel()
        dist.broadcast(length, src=0, group=self.group)
        if not self.is_main:
            payload = torch.empty(int(length[0]), dtype=torch.uint8, device=self.device)
        dist.broadcast(payload, src=0, group=self.group)
        return bytes(payload.cpu().tolist()).decode("utf-8")

    # -- model and optimizer ------------------------------------------------------------
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        """Route ``model``'s training calls through DDP (or shard it with FSDP2); in Reduce mode
        also shard ``optimizer``.

        Returns ``(model, optimizer, no_sync)``: the same model object (its
        ``loss``/``forward`` now synchronise gradients), the optimizer to step
        (a ``ZeroRedundancyOptimizer`` in Reduce mode; under FSDP the same optimizer over
        the sharded parameters) and ``no_sync()`` for gradient-accumulation micro-steps.
        """
        if self.routed is not None:
            raise LaunchError("ProcessGroupContext.wrap() was already called; use one context per model")
        if self.mode == "fsdp":
            self.routed = shard_model(model, optimizer, self.fsdp, device=self.device, group=self.group)
            return model, optimizer, self.routed.no_sync
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp_kwargs = dict(device_ids=device_ids, bucket_cap_mb=self.bucket_mb,
                          forward_sync_buffers=False, gradient_as_bucket_view=True,
                          find_unused_parameters=self.find_unused_parameters,
                          process_group=self.group)
        if self.mode == "reduce":
            optimizer = zero_optimizer(optimizer, self.group)
        self.routed = route_through_ddp(model, **ddp_kwargs)
        log.info("data parallel: %s over %d ranks (%s), buckets of %.1f MB", self.mode,
                 self.world_size, self.backend, self.bucket_mb)
        return model, optimizer, self.routed.no_sync

    # -- data and statistics --------------------------------------------------------------
    def shard_reader(self, reader: Any) -> ShardedReader:
        """This rank's rows of every batch (see :mod:`hotloop.parallel.sharding`)."""
        return ShardedReader(reader, self.rank, self.world_size)

    def all_reduce_stats(self, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        """Sum statistics over ranks in one collective (counts stay exact: float64 below 2**53)."""
        if not stats:
            return {}
        keys = sorted(stats)
        values = [torch.as_tensor(stats[k]) for k in keys]
        flat = torch.stack([v.detach().to(self.device, torch.float64).reshape(()) for v in values])
        dist.all_reduce(flat, group=self.group)                     # [num stats], float64
        out = {}
        for i, (key, value) in enumerate(zip(keys, values)):
            out[key] = flat[i].to(value.device, value.dtype)
        return out

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            dist.barrier(group=self.group)

    def consolidate_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Collective (call on every rank): the full optimizer ``state_dict`` on the main rank.

        In Reduce and FSDP modes the shards are gathered to rank 0 (other ranks get ``{}``);
        the result indexes all parameters in torch's layout, so it loads into any world
        size, any mode or a single process.
        """
        if isinstance(self.routed, FSDPModel):
            return full_optimizer_state(self.routed.model, optimizer)
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            optimizer.consolidate_state_dict(to=0)
            return optimizer.state_dict() if self.is_main else {}
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a full optimizer ``state_dict`` (every rank passes it); a sharded optimizer keeps its part."""
        if isinstance(self.routed, FSDPModel):
            load_full_optimizer_state(self.routed.model, optimizer, state)
        else:
            optimizer.load_state_dict(state)

    def close(self, failed: bool = False) -> None:
        """Leave the process group (call once at the end of the job).

        After a clean run every rank waits for the others first; after a failure
        (``failed=True``) it leaves at once, since peers may be inside a collective.
        """
        if self.routed is not None:
            self.routed.unpatch()
            self.routed = None
        if dist.is_initialized():
            if not failed:
                dist.barrier()  # no rank tears the group (or rank 0's store) down under a peer still using it
            dist.destroy_process_group()
