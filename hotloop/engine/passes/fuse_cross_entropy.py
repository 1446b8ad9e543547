"""Softmax cross-entropy backward: ``nll_loss_backward`` + ``_log_softmax_backward_data`` -> one call.

``F.cross_entropy`` traces to ``_log_softmax`` + ``nll_loss_forward`` and, in
the backward, to a dense one-hot ``nll_loss_backward`` [N, C] followed by
``_log_softmax_backward_data`` (g - exp(lp) * rowsum(g)). Since the one-hot
row sums to exactly ``-s``, the pair equals ``exp(lp) * s`` with ``s``
subtracted at the target (0 for ignored rows): one exp/mul over [N, C] and a
scatter, without the dense one-hot tensor or the row reduction.
The fused op performs the same float operations in the same order
(``s*e - s`` at the target, ``s*e`` elsewhere) -- but ``torch.exp`` is not the
faster vectorised exp inside ``_log_softmax_backward_data``, so about one element in
ten differs by an ulp: the pass is *approximate* and runs only with ``Strategy.fast_math``.
It runs after ``collapse_views``, which strips the ``detach`` autograd puts on saved values.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx

from .rules import Op, PassResult, RewriteRule, Var, apply_rules, meta

__all__ = ["RULES", "fuse_cross_entropy", "softmax_xent_backward"]

aten = torch.ops.aten
MEAN, SUM = 1, 2


def softmax_xent_backward(grad: Tensor, log_probs: Tensor, target: Tensor, reduction: int,
                          ignore_index: int, total_weight: Tensor) -> Tensor:
    """d(loss)/d(logits) for ``nll_loss(log_softmax(x))``. log_probs [N, C], target [N] -> [N, C]."""
    scale = grad / total_weight if reduction == MEAN else grad          # 0-d
    valid = target != ignore_index                                       # [N]
    row = torch.where(valid, scale, torch.zeros((), dtype=scale.dtype))  # [N]
    out = torch.exp(log_probs) * row.unsqueeze(1)                        # [N, C]
    safe = torch.where(valid, target, torch.zeros((), dtype=target.dtype)).unsqueeze(1)  # [N, 1]
    out.scatter_add_(1, safe, (-row).unsqueeze(1).to(out.dtype))
    return out


def _applies(b: dict[str, Any]) -> bool:
    lp = meta(b["lp"])
    return (b["weight"] is None and b["reduction"] in (MEAN, SUM) and isinstance(lp, torch.Tensor)
            and lp.dim() == 2 and b["dim"] in (1, -1) and b["dtype"] == lp.dtype
            and meta(b["g"]).dim() == 0)


def _build(graph: fx.Graph, b: dict[str, Any], root: fx.Node) -> fx.Node:
    return graph.call_function(softmax_xent_backward,
                               (b["g"], b["lp"], b["target"], b["reduction"], b["ignore"], b["tw"]))


RULES = [
    RewriteRule(
        "nll_log_softmax_backward",
        Op(aten._log_softmax_backward_data.default,
           Op(aten.nll_loss_backward.default, Var("g"), Var("lp"), Var("target"), Var("weight"),
              Var("reduction"), Var("ignore"), Var("tw")),
           Var("lp"), Var("dim"), Var("dtype")),
        where=_applies, build=_build,
        doc="nll_loss_backward(g, lp, t) -> _log_softmax_backward_data(., lp) => softmax_xent_backward"),
]


def fuse_cross_entropy(gm: fx.GraphModule) -> PassResult:
    return apply_rules(gm, RULES, "fuse_cross_entropy")
