"""hotloop's graph passes over captured FX graphs, each a set of rewrite rules with match counts."""
from __future__ import annotations

from typing import Callable

from torch import fx

from .collapse_views import collapse_views
from .dce import eliminate_dead_code
from .fuse_cross_entropy import fuse_cross_entropy
from .inplace_activations import inplace_activations
from .rules import PassResult
from .unbind_slices import unbind_slices

__all__ = ["APPROXIMATE", "PASSES", "PASS_NAMES", "PassResult", "run_passes", "selected_passes"]

#: Pass order: algebraic rewrites, then DCE, then inplace (it needs final user counts).
PASSES: dict[str, Callable[[fx.GraphModule], PassResult]] = {
    "collapse_views": collapse_views,
    "unbind_slices": unbind_slices,
    "fuse_cross_entropy": fuse_cross_entropy,
    "dce": eliminate_dead_code,
    "inplace_activations": inplace_activations,
}
PASS_NAMES = tuple(PASSES)
#: Passes that change rounding (a different but equivalent formula); they run only with
#: ``Strategy.fast_math`` and are checked against a tolerance instead of bitwise.
APPROXIMATE = ("fuse_cross_entropy",)


def selected_passes(graph_passes: bool, inplace: bool, disabled: tuple[str, ...] = (),
                    fast_math: bool = False) -> list[str]:
    """Passes a strategy runs: the exact ones when ``graph_passes`` (plus :data:`APPROXIMATE`
    with ``fast_math``), and ``inplace_activations`` when ``inplace``."""
    names = [n for n in PASS_NAMES if n != "inplace_activations"
             and (fast_math or n not in APPROXIMATE)] if graph_passes else []
    if inplace:
        names.append("inplace_activations")
    return [n for n in names if n not in disabled]


def run_passes(gm: fx.GraphModule, names: list[str]) -> list[PassResult]:
    """Run the named passes in :data:`PASS_NAMES` order on ``gm`` (in place); return their results."""
    return [PASSES[name](gm) for name in PASS_NAMES if name in names]
