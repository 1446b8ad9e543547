"""The inductor backend's scope when the whole loss is not one graph: each unit compiled on its own.

Two kinds of step compile unit by unit. A phased model's losses (a GAN's) keep Python state
between phases: CycleGAN's image pools draw their own random numbers and the generator phase
leaves its fakes for the discriminator phase. Compiling a whole phase loss would trace that
bookkeeping into the graph, draw inductor's random numbers in place of eager's, and compile one
large graph per phase (157 s for ``cyclegan_small`` on the 2-core EPYC,
``docs/data/zoo_cyclegan_compiled_expert.json``). Compiling each network instead (the generators
and discriminators) leaves the bookkeeping eager, in eager's random stream, and compiles each
network's forward (and, through AOT autograd, its backward) once per kind of call; networks of the
same structure share their code. A one-loss model whose loss has shapes that depend on the data
can name the parts that do compile in ``compile_units()``; a unit with ``dynamic_shapes = True``
(one whose row count changes every call) is compiled once for symbolic shapes instead of once per
shape.

The compiled calls are switched on only inside the step's forward (:meth:`CompiledNetworks.active`):
evaluation, export and checkpoints see the plain modules, and a state dict keeps its keys.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from .program import model_phases

__all__ = ["CompiledNetworks", "compile_networks", "network_types", "compiles_by_units", "dynamic_shapes",
           "names_units"]


def compile_networks(model: nn.Module) -> list[nn.Module]:
    """The networks compiled one by one: the model's own ``compile_units()`` when it has one,
    else its direct children that hold trainable parameters."""
    if names_units(model):
        return list(model.compile_units())
    return [child for child in model.children() if any(p.requires_grad for p in child.parameters())]


def names_units(model: nn.Module) -> bool:
    """Whether ``model`` names its own ``compile_units()``."""
    return callable(getattr(model, "compile_units", None))


def compiles_by_units(model: nn.Module) -> bool:
    """Whether the inductor backend compiles ``model``'s step unit by unit: a model of several
    phases, or one that names its ``compile_units()``; else its whole loss is one graph."""
    return len(model_phases(model) or ()) > 1 or names_units(model)


def network_types(model: nn.Module) -> tuple[type, ...]:
    """Types of the units a step of ``model`` compiles one by one (:func:`compile_networks`), none
    when its whole loss is one graph (:func:`compiles_by_units`)."""
    if not compiles_by_units(model):
        return ()
    return tuple(dict.fromkeys(type(net) for net in compile_networks(model)))


def dynamic_shapes(net: nn.Module) -> bool:
    """Whether ``net`` is compiled for symbolic shapes (its ``dynamic_shapes`` attribute)."""
    return bool(getattr(net, "dynamic_shapes", False))


class CompiledNetworks:
    """``torch.compile`` of each network's call (with inductor's ``options``), active only inside
    :meth:`active`."""

    def __init__(self, networks: list[nn.Module], options: dict[str, Any] | None = None) -> None:
        if not networks:
            raise ValueError("no network to compile: the model has no child module with trainable parameters")
        self.networks = list(networks)
        # what nn.Module.compile() sets; assigned here only while the step runs (see active)
        self.calls = [torch.compile(net._call_impl, options=options,
                                    dynamic=True if dynamic_shapes(net) else None)
                      for net in self.networks]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route each network's ``__call__`` to its compiled call inside the block."""
        for net, call in zip(self.networks, self.calls):
            net._compiled_call_impl = call
        try:
            yield
        finally:
            for net in self.networks:
                net._compiled_call_impl = None

    def describe(self) -> str:
        names = sorted({type(net).__name__ for net in self.networks})
        return f"{len(self.networks)} network(s) compiled one by one ({', '.join(names)})"
