"""Whole-step capture: forward + loss + backward as one aten-level FX graph.

``capture_joint`` traces ``loss_fn`` with parameters swapped for graph inputs
and ``torch.autograd.grad`` inside, under ``make_fx`` with fake tensors, so the
backward ops land in the same graph (the joint graph). A second trace through
``torch.func.functionalize`` removes every mutation, which makes the graph
safe to rewrite and to run out of order (its random draws keep eager's memory order:
:mod:`hotloop.engine.random_layout`). Fake-tensor tracing never reads a
value, so data-dependent Python control flow (``if t.any():``, ``.item()``)
raises instead of being baked in: :class:`CaptureError` says where.

A :class:`Signature` is everything a captured graph is specialised on: the
shape, dtype, device and requires_grad of every parameter, buffer, batch and
state tensor, plus the training flag, whether it is one micro-batch of several, and the precision (the
strict check of tinygrad's TinyJit). Anything else changing means a new capture.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, fx, nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree

from ..problems.base import Batch
from .passes import PassResult, run_passes
from .passes.collapse_views import returns_fresh
from .precision import Precision
from .random_layout import keep_random_layouts

__all__ = ["flatten_state", "unflatten_state", "CaptureError", "CapturedGraph", "Signature", "capture_joint", "step_signature", "GraphLayout"]


class CaptureError(RuntimeError):
    """The step could not be captured as one graph; ``reason`` is a one-line cause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Signature = tuple


def _tensor_sig(t: Any) -> Any:
    if isinstance(t, Tensor):
        return ("T", tuple(t.shape), t.dtype, t.device.type, t.device.index, t.requires_grad)
    return ("V", repr(t))


def flatten_state(state: Any) -> tuple[list[Tensor], Any]:
    """Tensor leaves of a carried state and how to rebuild it (``None`` leaves are kept)."""
    leaves, spec = pytree.tree_flatten(state)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    if any(leaf is not None and not isinstance(leaf, Tensor) for leaf in leaves):
        raise CaptureError("capture failed: carried state holds non-tensor values")
    return [leaves[i] for i in positions], (spec, len(leaves), positions)


def unflatten_state(tensors: list[Tensor], packed: Any) -> Any:
    spec, count, positions = packed
    leaves: list[Any] = [None] * count
    for i, t in zip(positions, tensors):
        leaves[i] = t
    return pytree.tree_unflatten(leaves, spec)


def step_signature(model: nn.Module, batch: Batch, state: Any, weighted: bool, precision: str) -> Signature:
    """Everything a capture is specialised on (see module doc); ``weighted``: a micro-batch of an
    accumulated step (its loss is multiplied by its weight), whatever the number of micro-batches."""
    params = tuple(_tensor_sig(p) for p in model.parameters())
    buffers = tuple(_tensor_sig(b) for b in model.buffers())
    data = tuple((k, _tensor_sig(v)) for k, v in sorted(batch.items()))
    leaves, spec = pytree.tree_flatten(state)
    return (params, buffers, data, tuple(_tensor_sig(x) for x in leaves), repr(spec),
            model.training, weighted, precision)


@dataclass
class GraphLayout:
    """How the flat graph inputs/outputs map back to step values."""

    param_names: list[str]
    buffer_names: list[str]
    batch_keys: list[str]
    state_spec: Any
    stat_keys: list[str] = field(default_factory=list)
    out_state_spec: Any = None
    used_grads: list[int] = field(default_factory=list)   # param indices with a gradient
    num_state_out: int = 0


@dataclass
class CapturedGraph:
    gm: fx.GraphModule
    layout: GraphLayout
    passes: list[PassResult]
    capture_seconds: float
    nodes_captured: int

    def activation_peak_bytes(self) -> int:
        """Peak bytes of live intermediate values when run in graph order (inputs excluded)."""
        nodes = list(self.gm.graph.nodes)
        last: dict[fx.Node, int] = {}
        for pos, n in enumerate(nodes):
            for a in n.all_input_nodes:
                last[a] = pos
        outputs = set(nodes[-1].all_input_nodes) if nodes and nodes[-1].op == "output" else set()
        live = peak = 0
        dying: dict[int, int] = {}
        for pos, n in enumerate(nodes):
            if n.op == "call_function":
                size = _bytes(n.meta.get("val")) if returns_fresh(n) else 0  # views own no memory
                live += size
                if n in outputs or n not in last:
                    dying.setdefault(len(nodes), 0)
                else:
                    dying[last[n]] = dying.get(last[n], 0) + size
            peak = max(peak, live)
            live -= dying.pop(pos, 0)
        return peak

    def parallelism(self) -> tuple[int, float]:
        """(critical path length in ops, average ops per level): how much a parallel executor can overlap."""
        depth: dict[fx.Node, int] = {}
        for n in self.gm.graph.nodes:
            if n.op == "call_function":
                depth[n] = 1 + max((depth.get(a, 0) for a in n.all_input_nodes), default=0)
        if not depth:
            return 0, 0.0
        critical = max(depth.values())
        return critical, len(depth) / critical

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.gm.graph.nodes:
            if n.op == "call_function":
                name = getattr(n.target, "__name__", str(n.target))
                counts[name] = counts.get(name, 0) + 1
        return counts


def _bytes(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    name = type(exc).__name__
    if "data-dependent" in str(exc).lower() or "DataDependent" in name:
        return f"graph break: data-dependent value read during capture ({name}: {first[:160]})"
    return f"capture failed: {name}: {first[:200]}"


def capture_joint(model: nn.Module, loss_fn: Callable[..., Any], batch: Batch, state: Any,
                  precision: Precision, passes: list[str]) -> CapturedGraph:
    """Trace one micro-batch step (forward, loss, grads) into a functional FX graph, under
    ``precision``'s autocast."""
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    buffer_names = [n for n, _ in model.named_buffers()]
    buffers = [b for _, b in model.named_buffers()]
    keys = sorted(batch)
    state_leaves, state_spec = flatten_state(state)
    layout = GraphLayout(names, buffer_names, keys, state_spec)
    n_p, n_b, n_d = len(params), len(buffers), len(keys)

    def joint(*flat: Tensor) -> list[Tensor]:
        p_in, b_in = flat[:n_p], flat[n_p:n_p + n_b]
        data = dict(zip(keys, flat[n_p + n_b:n_p + n_b + n_d]))
        st = unflatten_state(list(flat[n_p + n_b + n_d:]), state_spec)
        mapping = {**dict(zip(names, p_in)), **dict(zip(buffer_names, b_in))}
        # tie_weights: a parameter shared by several modules (tied embeddings) is traced under each name
        with _reparametrize_module(model, mapping, tie_weights=True), precision.autocast():
            out = loss_fn(model, data, st)
        loss = out.loss
        wants = [i for i, p in enumerate(p_in) if p.requires_grad]
        grads = torch.autograd.grad(loss, [p_in[i] for i in wants], allow_unused=True)
        layout.used_grads = [i for i, g in zip(wants, grads) if g is not None]
        layout.stat_keys = sorted(out.stats)
        new_state, layout.out_state_spec = flatten_state(out.state)
        layout.num_state_out = len(new_state)
        return ([loss.detach()] + [out.stats[k] for k in layout.stat_keys]
                + [s.detach() for s in new_state] + [g for g in grads if g is not None])

    flat_in = [p.detach().requires_grad_(p.requires_grad) for p in params] + list(buffers)
    flat_in += [batch[k] for k in keys] + list(state_leaves)
    started = time.perf_counter()
    try:
        with torch.enable_grad():
            traced = make_fx(joint, tracing_mode="fake")(*flat_in)
        detached = [x.detach() for x in flat_in]
        gm = make_fx(torch.func.functionalize(traced, remove="mutations"), tracing_mode="fake")(*detached)
        keep_random_layouts(gm)           # dropout masks drawn in eager's memory order
    except CaptureError:
        raise
    except Exception as exc:  # noqa: BLE001 - every tracing failure becomes a recorded fallback
        raise CaptureError(_describe(exc)) from exc
    _check_supported(gm)
    nodes = len(gm.graph.nodes)
    results = run_passes(gm, passes) if passes else []
    _check_no_leftover_mutation(gm, n_p, n_b)
    return CapturedGraph(gm, layout, results, time.perf_counter() - started, nodes)


#: ops whose fake (tracing) kernels do not reproduce what their backward needs
UNSUPPORTED = {
    "mkldnn_rnn_layer": "oneDNN LSTM (mkldnn_rnn_layer) keeps a workspace that tracing cannot "
                        "reproduce; set strategy onednn=False (nn.LSTM then traces to primitive ops) "
                        "or use an unrolled LSTM",
}


def _check_supported(gm: fx.GraphModule) -> None:
    for n in gm.graph.nodes:
        if n.op == "call_function":
            base = getattr(getattr(n.target, "_overloadpacket", None), "__name__", "")
            if base in UNSUPPORTED:
                raise CaptureError(f"unsupported op: {UNSUPPORTED[base]}")


def _check_no_leftover_mutation(gm: fx.GraphModule, n_p: int, n_b: int) -> None:
    """Functionalization writes buffer updates back with ``copy_``; parameters must stay untouched."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = set(placeholders[:n_p])
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in params:
            raise CaptureError("capture failed: the step writes to a parameter in place")
