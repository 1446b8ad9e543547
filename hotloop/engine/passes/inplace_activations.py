"""Inplace activations where provably safe: ``relu(x)`` -> ``relu_(x)`` (also tanh, sigmoid).

Safety conditions, all checked on the captured joint (forward + backward) graph:

1. ``x`` is a fresh tensor (made by an op whose schema returns no alias of its
   inputs: not a graph input, parameter or constant), or a chain of
   non-overlapping views (view, reshape, transpose, permute, squeeze, unsqueeze)
   of such a tensor in which every link has exactly one user; so overwriting
   ``x`` changes no tensor anyone else reads;
2. the activation is ``x``'s only user: nothing else reads ``x`` later, including
   the backward (an op whose gradient needs its input would be a second user);
3. dtype, shape and strides of ``x`` and the result agree (no promotion, no resize).

The activation's backward reads the *output* (``threshold_backward``, ``tanh_backward``,
``sigmoid_backward``), which is what the inplace op returns.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .collapse_views import returns_fresh
from .rules import Op, PassResult, RewriteRule, Var, apply_rules, meta

__all__ = ["RULES", "inplace_activations", "INPLACE", "exclusively_owned", "PLAIN_VIEWS"]

aten = torch.ops.aten
INPLACE = {aten.relu.default: aten.relu_.default, aten.tanh.default: aten.tanh_.default,
           aten.sigmoid.default: aten.sigmoid_.default}


#: views that never make elements overlap (``expand`` does, so it is not here)
PLAIN_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int,
               aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default}


def exclusively_owned(node: Any) -> bool:
    """True when ``node``'s memory is read by nobody but ``node``'s single user (see rule 1)."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return False
    if returns_fresh(node):
        return True
    return node.op == "call_function" and node.target in PLAIN_VIEWS and exclusively_owned(node.args[0])


def _safe(b: dict[str, Any]) -> bool:
    x, root = b["x"], b["root"]
    if not exclusively_owned(x):
        return False
    mx, mr = meta(x), meta(root)
    return (isinstance(mx, torch.Tensor) and isinstance(mr, torch.Tensor) and mx.dtype == mr.dtype
            and mx.shape == mr.shape and mx.stride() == mr.stride())


RULES = [RewriteRule(f"{op.__name__.split('.')[0]}_inplace", Op(op, Var("x"), bind="root"),
                     Op(inplace, Var("x")), where=_safe)
         for op, inplace in INPLACE.items()]


def inplace_activations(gm: fx.GraphModule) -> PassResult:
    return apply_rules(gm, RULES, "inplace_activations")
