"""Dead-code elimination: drop ops whose values nobody uses.

Ops that write to an argument or draw random numbers are kept even when
unused: removing a random op would shift the RNG stream of every later one.
"""
from __future__ import annotations

from torch import fx

from ..executors import is_random_op, mutated_args
from .rules import PassResult

__all__ = ["eliminate_dead_code"]


def eliminate_dead_code(gm: fx.GraphModule) -> PassResult:
    graph = gm.graph
    result = PassResult("dce", {"unused_op": 0}, nodes_before=len(graph.nodes))
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or node.users:
            continue
        if is_random_op(node) or mutated_args(node):
            continue
        graph.erase_node(node)
        result.matches["unused_op"] += 1
    graph.lint()
    gm.recompile()
    result.nodes_after = len(graph.nodes)
    return result
