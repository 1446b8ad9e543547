"""``data_parallel=fsdp``: the model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each block of :func:`hotloop.engine.activation_ckpt.block_units` (transformer layers,
residual stages) is one FSDP unit over a 1-D ``DeviceMesh`` of the job's ranks; the
remaining parameters (embeddings, heads) belong to the root unit, an adapter module
through which every outermost ``model.loss`` / ``model(...)`` call is routed
(:mod:`hotloop.parallel.routing`, ``always=True``: evaluation gathers parameters too).
Between steps a rank holds 1/N of the parameters, gradients and optimizer state; a
unit's parameters are all-gathered for its forward and backward, its gradients
reduce-scattered after its backward.

- Precision: ``bf16`` computes with bf16 parameters and reduces gradients in fp32
  (``MixedPrecisionPolicy``); ``fp32`` uses no policy.
- ``reshard_after_forward`` (a Strategy field): free each unit's gathered parameters after
  its forward (gather again for backward) or keep them until its backward. The root keeps
  its parameters gathered until backward either way.
- Gradient accumulation: :meth:`FSDPModel.no_sync` turns gradient sync off, so the
  non-final micro-batches reduce-scatter nothing.
- The optimizer built over the unsharded parameters is re-pointed to the sharded
  (``DTensor``) ones, so every rank's optimizer state covers its shard only.
- Initial parameters and buffers are rank 0's (broadcast before sharding, as DDP does).
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from ..engine.activation_ckpt import block_units
from .errors import ShardedStateError
from .routing import MethodAdapter, RoutedModel, check_unrouted, route_through

__all__ = ["FSDPConfig", "FSDPModel", "mixed_precision_policy", "shard_model"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FSDPConfig:
    """What the Strategy decides for FSDP: the run's precision and ``reshard_after_forward``."""

    precision: str = "fp32"
    reshard_after_forward: bool = True


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """bf16 parameters with fp32 gradient reduction for a ``bf16`` run; no policy otherwise."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "fp32":
        return MixedPrecisionPolicy()
    raise ShardedStateError(f"data_parallel=fsdp with precision={precision!r}: use fp32 or bf16")


class FSDPModel(RoutedModel):
    """A model sharded by FSDP2: ``units`` (one FSDP module each) and the ``root`` adapter."""

    def __init__(self, model: nn.Module, root: FSDPModule, units: list[nn.Module]) -> None:
        super().__init__(model, root, always=True, no_sync=self._no_sync_fsdp)  # type: ignore[arg-type]
        self.root = root
        self.units = units

    @contextlib.contextmanager
    def _no_sync_fsdp(self) -> Iterator[None]:
        """Backward inside accumulates unsharded gradients locally; the next synced backward
        reduce-scatters the sum."""
        self.root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.root.set_requires_gradient_sync(True)

    def fsdp_modules(self) -> list[FSDPModule]:
        """Every FSDP module: the units, then the root."""
        return [m for m in [*self.units, self.root] if isinstance(m, FSDPModule)]


@torch.no_grad()
def _broadcast_from_rank0(model: nn.Module, group: Any) -> None:
    """Every parameter and buffer as rank 0 holds it (one broadcast per tensor)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0, group=group)


def _repoint(optimizer: torch.optim.Optimizer, before: dict[str, nn.Parameter],
             after: dict[str, nn.Parameter]) -> None:
    """Make ``optimizer``'s groups hold the sharded parameters in place of the unsharded ones."""
    if optimizer.state:
        raise ShardedStateError("data_parallel=fsdp shards a fresh optimizer; load its state after wrap()")
    sharded = {id(before[name]): after[name] for name in before}
    for group in optimizer.param_groups:
        try:
            group["params"] = [sharded[id(p)] for p in group["params"]]
        except KeyError:
            raise ShardedStateError("the optimizer holds a tensor that is not a parameter of the model "
                                    "(data_parallel=fsdp re-points its groups to the sharded parameters)") from None


def _mesh(group: Any, device: torch.device) -> DeviceMesh:
    if group is None:
        return init_device_mesh(device.type, (dist.get_world_size(),))
    return DeviceMesh.from_group(group, device.type)


def shard_model(model: nn.Module, optimizer: torch.optim.Optimizer, config: FSDPConfig, *,
                device: torch.device, group: Any = None) -> FSDPModel:
    """Shard ``model`` (units, then the root) and re-point ``optimizer``; patch the model's calls."""
    check_unrouted(model)
    # The root returns the model's LossOutput, whose tensors may be views; nothing here modifies
    # them in place (the case FSDP warns about), so its warning is noise for this adapter only.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPMethodAdapter\) returned a view")
    policy = mixed_precision_policy(config.precision)
    mesh = _mesh(group, device)
    _broadcast_from_rank0(model, group)
    before = dict(model.named_parameters())
    units = block_units(model)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=config.reshard_after_forward, mp_policy=policy)
    # The root keeps its gathered parameters until backward: its output (a LossOutput) is no
    # tensor FSDP can hook a pre-backward gather on, and backward needs them at once anyway
    root = fully_shard(MethodAdapter(model), mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    _repoint(optimizer, before, dict(model.named_parameters()))
    log.info("fsdp: %d units (%s) + root over %d ranks, precision %s, reshard_after_forward=%s",
             len(units), ", ".join(sorted({type(u).__name__ for u in units})) or "none",
             mesh.size(), config.precision, config.reshard_after_forward)
    return route_through(FSDPModel(model, root, units))  # type: ignore[return-value]
