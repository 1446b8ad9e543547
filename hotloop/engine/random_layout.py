"""Random draws of a captured graph filled in eager's memory order.

Dropout draws its mask in place: ``empty_like(x).bernoulli_(1 - p)``, a buffer with ``x``'s strides
filled in memory order. ``torch.func.functionalize`` turns the in-place draw into
``aten.bernoulli.p``, whose result is allocated contiguous: where ``x`` is a strided view (an
attention output transposed back to batch-first), the same random numbers land on other elements,
and the captured step drops other units than the eager step (a ``nn.TransformerEncoderLayer``'s
first loss 3e-4 apart). :func:`keep_random_layouts` makes each such node a call of
``hotloop::bernoulli_like`` (:func:`bernoulli_like`), which draws in place into a buffer laid out
like its input, as eager does: the captured step then draws eager's masks bitwise.
"""
from __future__ import annotations

import torch
from torch import Tensor, fx

__all__ = ["bernoulli_like", "keep_random_layouts"]


@torch.library.custom_op("hotloop::bernoulli_like", mutates_args=(), tags=torch.Tag.nondeterministic_seeded)
def bernoulli_like(like: Tensor, p: float) -> Tensor:
    """``empty_like(like).bernoulli_(p)``: 1 with probability ``p``, in ``like``'s layout (its strides)."""
    return torch.empty_like(like).bernoulli_(p)


@bernoulli_like.register_fake
def _bernoulli_like_shape(like: Tensor, p: float) -> Tensor:
    return torch.empty_like(like)


def keep_random_layouts(gm: fx.GraphModule) -> None:
    """Make every ``aten.bernoulli.p`` of ``gm`` drawn from the default generator a call of
    :func:`bernoulli_like` (same input, same probability)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.bernoulli.p \
                and node.kwargs.get("generator") is None:
            p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)     # the schema's default
            node.target, node.args, node.kwargs = torch.ops.hotloop.bernoulli_like.default, (node.args[0], p), {}
            changed = True
    if changed:
        gm.recompile()
