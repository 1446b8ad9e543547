"""What a model looks like to the autotuner: layer counts, parameters, FLOPs and op sizes.

``analyze_model`` walks the modules (Linear / LSTM / GRU / Conv / Embedding
counts, sparse embeddings, parameter count) and runs one forward + backward of
a *copy* on a real batch under torch's FLOP counter and an aten-op counter, so
the FLOPs per step, the matmul and convolution shares and the mean op size
are measured rather than guessed.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..engine.compiled_networks import dynamic_shapes
from ..problems.base import Batch
from .isolation import preserved_process_state

__all__ = ["ModelFacts", "StepCounts", "analyze_model", "count_layers", "counting", "initial_state_for"]

_MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_dot_product")
_CONV_OPS = ("convolution", "conv")
_LAYER_KINDS: dict[str, tuple[type, ...]] = {
    "linear": (nn.Linear, nn.Bilinear),
    "recurrent": (nn.LSTM, nn.GRU, nn.RNN, nn.LSTMCell, nn.GRUCell, nn.RNNCell),
    "conv": (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d),
    "embedding": (nn.Embedding, nn.EmbeddingBag),
    "attention": (nn.MultiheadAttention,),
    "norm": (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm),
}


@dataclass(frozen=True)
class ModelFacts:
    model_class: str
    params: int
    layers: dict[str, int]               # kind -> count (see _LAYER_KINDS)
    sparse_embeddings: int               # nn.Embedding(sparse=True) count
    has_conv2d: bool                     # channels_last only helps 4-D convolutions
    flops_per_step: float = 0.0          # forward + backward, one optimizer step
    ops_per_step: int = 0                # aten ops dispatched in forward + backward
    flop_share: dict[str, float] = field(default_factory=dict)  # "matmul"/"conv"/"other" -> 0..1
    compiled_ops: int = 0                # aten ops a compile of the step traces (see StepCounts)

    def with_counts(self, counts: "StepCounts") -> "ModelFacts":
        return dataclasses.replace(self, flops_per_step=counts.flops, ops_per_step=counts.ops,
                                   flop_share=dict(counts.share), compiled_ops=counts.compiled_ops)

    @property
    def flops_per_op(self) -> float:
        return self.flops_per_step / max(self.ops_per_step, 1)

    def summary(self) -> str:
        layers = ", ".join(f"{k}={v}" for k, v in self.layers.items() if v) or "none"
        share = ", ".join(f"{k} {v:.0%}" for k, v in self.flop_share.items())
        return (f"{self.model_class}: {self.params / 1e6:.2f}M params; layers {layers}; "
                f"{self.flops_per_step / 1e9:.3f} GFLOP/step over {self.ops_per_step} ops "
                f"({self.flops_per_op / 1e6:.2f} MFLOP/op); FLOPs {share or 'n/a'}"
                + (f"; networks compiled one by one trace ~{self.compiled_ops} ops"
                   if self.compiled_ops and self.compiled_ops != self.ops_per_step else ""))


def count_layers(model: nn.Module) -> tuple[dict[str, int], int, bool]:
    """(kind -> count, sparse embedding count, has 2-D conv) from a module walk."""
    counts: Counter[str] = Counter()
    sparse = 0
    conv2d = False
    for module in model.modules():
        for kind, types in _LAYER_KINDS.items():
            if isinstance(module, types):
                counts[kind] += 1
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            sparse += 1
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            conv2d = True
    return {kind: counts.get(kind, 0) for kind in _LAYER_KINDS}, sparse, conv2d


class _OpCounter(TorchDispatchMode):
    """Counts aten ops reaching the dispatcher (after FlopCounterMode's own bookkeeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


def _share(flop_counts: dict[str, dict[Any, int]]) -> tuple[float, dict[str, float]]:
    per_op = flop_counts.get("Global", {})
    total = float(sum(per_op.values()))
    buckets = {"matmul": 0.0, "conv": 0.0, "other": 0.0}
    for op, flops in per_op.items():
        name = getattr(op, "__name__", str(op).rsplit(".", 1)[-1])
        if any(name.startswith(m) for m in _MATMUL_OPS):
            buckets["matmul"] += flops
        elif any(name.startswith(c) for c in _CONV_OPS):
            buckets["conv"] += flops
        else:
            buckets["other"] += flops
    return total, {k: v / total for k, v in buckets.items()} if total else {}


@dataclass
class StepCounts:
    flops: float = 0.0
    ops: int = 0
    share: dict[str, float] = field(default_factory=dict)
    network_calls: int = 0        # calls of the networks compiled one by one (``counting(networks)``)
    network_kinds: int = 0        # distinct kinds of those calls: what dynamo compiles a graph for

    @property
    def compiled_ops(self) -> int:
        """Ops a compile traces: all of them for a whole-loss compile; with networks compiled one by
        one, the ops times the share of network calls that are of a kind not seen before."""
        if not self.network_calls:
            return self.ops
        return round(self.ops * self.network_kinds / self.network_calls)


def _call_kind(module: nn.Module, args: tuple) -> tuple:
    """What a compiled unit's guards tell apart: its type, the grad mode, and each tensor argument's
    shape (only its rank for a unit of ``dynamic_shapes``), dtype and requires_grad."""
    dynamic = dynamic_shapes(module)
    tensors = tuple((a.dim() if dynamic else tuple(a.shape), a.dtype, a.requires_grad)
                    for a in args if isinstance(a, torch.Tensor))
    return type(module), torch.is_grad_enabled(), tensors


@contextlib.contextmanager
def counting(network_types: tuple[type, ...] = ()) -> Iterator[StepCounts]:
    """Count FLOPs (torch's FlopCounterMode) and aten ops of whatever runs inside the block, and
    the calls of modules of ``network_types`` (the units a step compiles one by one)."""
    counts = StepCounts()
    counter = FlopCounterMode(display=False)
    ops = _OpCounter()
    kinds: set[tuple] = set()

    def seen(module: nn.Module, args: tuple) -> None:
        if isinstance(module, network_types):
            counts.network_calls += 1
            kinds.add(_call_kind(module, args))
    hook = nn.modules.module.register_module_forward_pre_hook(seen) if network_types else None
    try:
        with counter, ops:
            yield counts
    finally:
        if hook is not None:
            hook.remove()
    counts.flops, counts.share = _share(counter.get_flop_counts())
    counts.ops = ops.count
    counts.network_kinds = len(kinds)


def initial_state_for(model: nn.Module, batch: Batch, device: torch.device) -> Any:
    init = getattr(model, "initial_state", None)
    if init is None:
        return None
    return init(next(iter(batch.values())).shape[0], device)


def analyze_model(model: nn.Module, batch: Batch | None = None, *,
                  loss_fn: Callable[[nn.Module, Batch, Any], Any] | None = None) -> ModelFacts:
    """Structure of ``model``; with ``batch``, also measured FLOPs/ops of one fwd+bwd (on a copy)."""
    layers, sparse, conv2d = count_layers(model)
    params = sum(p.numel() for p in model.parameters())
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    facts = ModelFacts(name, params, layers, sparse, conv2d)
    if batch is None:
        return facts
    clone = copy.deepcopy(model)
    device = next(clone.parameters()).device if params else torch.device("cpu")
    with preserved_process_state():
        state = initial_state_for(clone, batch, device)
        with counting() as counts:
            out = loss_fn(clone, batch, state) if loss_fn else clone.loss(batch, state)
            out.loss.backward()
    return facts.with_counts(counts)
