"""Per-step slices of one tensor -> one ``unbind`` / ``split``.

``x[:, t]`` for t in range(T) traces to T ``select(x, 1, t)`` ops; they become
one ``unbind(x, 1)`` and T ``getitem``s. Equal-width slices
``slice(x, d, i*k, (i+1)*k)`` become one ``split(x, k, d)``. Both produce the
same views of ``x`` (same storage, offsets and strides), so values are identical.

The grouping rules are data: which op, how to read (source, dim, index) from it,
and which op replaces the group.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx

from .rules import PassResult, meta

__all__ = ["GroupRule", "RULES", "unbind_slices"]

aten = torch.ops.aten


@dataclass(frozen=True)
class GroupRule:
    """Ops whose ``key(node)`` -> (source, dim, index, width) group into one ``replace`` call."""

    name: str
    target: Any
    key: Callable[[fx.Node], tuple | None]
    replace: Callable[[fx.Node, int, int], tuple]   # (source, dim, width) -> (target, args)


def _select_key(n: fx.Node) -> tuple | None:
    source, dim, index = n.args
    x = meta(source)
    if not isinstance(x, torch.Tensor):
        return None
    dim, size = dim % x.dim(), x.shape[dim % x.dim()]
    return source, dim, index % size, 1


def _slice_key(n: fx.Node) -> tuple | None:
    args = list(n.args) + [None] * (5 - len(n.args))
    source, dim, start, end, step = args[:5]
    x = meta(source)
    if not isinstance(x, torch.Tensor) or (step not in (None, 1)) or n.kwargs:
        return None
    dim = (0 if dim is None else dim) % x.dim()
    size = x.shape[dim]
    start, end = (start or 0), (size if end is None else min(end, size))
    if start < 0 or end <= start:
        return None
    width = end - start
    if start % width:
        return None
    return source, dim, start // width, width


RULES = [
    GroupRule("select_to_unbind", aten.select.int, _select_key,
              lambda src, dim, width: (aten.unbind.int, (src, dim))),
    GroupRule("slice_to_split", aten.slice.Tensor, _slice_key,
              lambda src, dim, width: (aten.split.Tensor, (src, width, dim))),
]


def _covers(source: fx.Node, dim: int, width: int) -> bool:
    x = meta(source)
    return x.shape[dim] % width == 0


def unbind_slices(gm: fx.GraphModule) -> PassResult:
    graph = gm.graph
    result = PassResult("unbind_slices", {r.name: 0 for r in RULES}, nodes_before=len(graph.nodes))
    for rule in RULES:
        groups: dict[tuple, dict[int, list[fx.Node]]] = {}
        for n in graph.nodes:
            if n.op == "call_function" and n.target == rule.target:
                key = rule.key(n)
                if key is not None:
                    source, dim, index, width = key
                    groups.setdefault((source, dim, width), {}).setdefault(index, []).append(n)
        for (source, dim, width), by_index in groups.items():
            if len(by_index) < 2 or not _covers(source, dim, width):
                continue
            order = {n: i for i, n in enumerate(graph.nodes)}
            first = min((n for ns in by_index.values() for n in ns), key=order.__getitem__)
            target, args = rule.replace(source, dim, width)
            with graph.inserting_before(first):
                parts = graph.call_function(target, args)
                items = {index: graph.call_function(operator.getitem, (parts, index))
                         for index in sorted(by_index)}
            for index, nodes in by_index.items():
                items[index].meta["val"] = nodes[0].meta.get("val")
                for n in nodes:
                    n.replace_all_uses_with(items[index])
                    graph.erase_node(n)
                    result.matches[rule.name] += 1
    graph.lint()
    gm.recompile()
    result.nodes_after = len(graph.nodes)
    return result
