"""Collapse redundant view / transpose / alias chains (values are never copied or changed).

- ``view(view(x, a), b)``          -> ``view(x, b)``   (x contiguous, so any view of it is legal)
- ``view(x, shape)`` with x.shape == shape -> ``x``
- ``transpose(transpose(x, a, b), a, b)`` -> ``x``; ``t(t(x))`` -> ``x``
- ``permute(permute(x, p), q)``    -> ``x`` when q undoes p
- ``detach(x)`` / ``alias(x)``      -> ``x``   (the executors run with autograd off)
- ``clone(x)`` -> ``x`` when x is a fresh (non-aliasing) value whose only user is the clone
  and the clone keeps x's strides (so nothing can observe the missing copy)
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .rules import Op, PassResult, RewriteRule, Var, apply_rules, meta

__all__ = ["RULES", "collapse_views", "returns_fresh"]

aten = torch.ops.aten
VIEWS = (aten.view.default, aten._unsafe_view.default)


def _contiguous(value: Any) -> bool:
    v = meta(value)
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _same_shape(b: dict[str, Any]) -> bool:
    x, root = meta(b["x"]), meta(b["root"])
    return isinstance(x, torch.Tensor) and isinstance(root, torch.Tensor) and x.shape == root.shape


def _transpose_undone(b: dict[str, Any]) -> bool:
    x = meta(b["x"])
    if not isinstance(x, torch.Tensor):
        return False
    n = x.dim()
    first = {b["a"] % n, b["b"] % n}
    return first == {b["c"] % n, b["d"] % n}


def _permute_undone(b: dict[str, Any]) -> bool:
    p, q = list(b["p"]), list(b["q"])
    return len(p) == len(q) and [p[i] for i in q] == list(range(len(p)))


def returns_fresh(node: Any) -> bool:
    """True when ``node`` is an op output that aliases none of its inputs (a new tensor)."""
    import operator
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return returns_fresh(node.args[0])
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    return all(r.alias_info is None for r in schema.returns) and not schema.is_mutable


def _clone_removable(b: dict[str, Any]) -> bool:
    x, root = b["x"], b["root"]
    if not returns_fresh(x) or len(x.users) != 1:
        return False
    mx, mr = meta(x), meta(root)
    return (isinstance(mx, torch.Tensor) and isinstance(mr, torch.Tensor)
            and mx.shape == mr.shape and mx.stride() == mr.stride() and mx.dtype == mr.dtype)


RULES = [
    RewriteRule("view_of_view", Op(VIEWS, Op(VIEWS, Var("x"), Var()), Var("shape")),
                Op(aten.view.default, Var("x"), Var("shape")),
                where=lambda b: _contiguous(b["x"]), shared_inner=True),
    RewriteRule("view_same_shape", Op(VIEWS, Var("x"), Var(), bind="root"), Var("x"), where=_same_shape),
    RewriteRule("transpose_pair",
                Op(aten.transpose.int, Op(aten.transpose.int, Var("x"), Var("a"), Var("b")), Var("c"), Var("d")),
                Var("x"), where=_transpose_undone, shared_inner=True),
    RewriteRule("t_pair", Op(aten.t.default, Op(aten.t.default, Var("x"))), Var("x"), shared_inner=True),
    RewriteRule("permute_pair", Op(aten.permute.default, Op(aten.permute.default, Var("x"), Var("p")), Var("q")),
                Var("x"), where=_permute_undone, shared_inner=True),
    RewriteRule("detach_noop", Op((aten.detach.default, aten.alias.default), Var("x")), Var("x")),
    RewriteRule("clone_of_fresh", Op(aten.clone.default, Var("x"), bind="root", allow_extra=True), Var("x"),
                where=_clone_removable),
]


def collapse_views(gm: fx.GraphModule) -> PassResult:
    return apply_rules(gm, RULES, "collapse_views")
