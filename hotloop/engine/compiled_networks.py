"""The inductor backend's scope for a step of several phases: each network compiled on its own.

A phased model's losses (a GAN's) keep Python state between phases: CycleGAN's image pools draw
their own random numbers and the generator phase leaves its fakes for the discriminator phase.
Compiling a whole phase loss would trace that bookkeeping into the graph, draw inductor's random
numbers in place of eager's, and compile one large graph per phase (157 s for ``cyclegan_small``
on the 2-core EPYC, ``docs/data/zoo_cyclegan_compiled_expert.json``). Compiling each network
instead (the generators and discriminators) leaves the bookkeeping eager, in eager's random stream, and compiles each network's forward (and, through
AOT autograd, its backward) once per kind of call; networks of the same structure share their code.

The compiled calls are switched on only inside the step's forward (:meth:`CompiledNetworks.active`):
evaluation, export and checkpoints see the plain modules, and a state dict keeps its keys.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from .program import model_phases

__all__ = ["CompiledNetworks", "compile_networks", "network_types"]


def compile_networks(model: nn.Module) -> list[nn.Module]:
    """The networks compiled one by one: the model's own ``compile_units()`` when it has one,
    else its direct children that hold trainable parameters."""
    units = getattr(model, "compile_units", None)
    if callable(units):
        return list(units())
    return [child for child in model.children() if any(p.requires_grad for p in child.parameters())]


def network_types(model: nn.Module) -> tuple[type, ...]:
    """Types of the networks a step of ``model`` compiles one by one: those of :func:`compile_networks`
    for a model of several phases, none for a one-loss model (its whole loss is one graph)."""
    if len(model_phases(model) or ()) < 2:
        return ()
    return tuple(dict.fromkeys(type(net) for net in compile_networks(model)))


class CompiledNetworks:
    """``torch.compile`` of each network's call, active only inside :meth:`active`."""

    def __init__(self, networks: list[nn.Module], mode: str | None) -> None:
        if not networks:
            raise ValueError("no network to compile: the model has no child module with trainable parameters")
        self.networks = list(networks)
        # what nn.Module.compile() sets; assigned here only while the step runs (see active)
        self.calls = [torch.compile(net._call_impl, mode=mode) for net in self.networks]

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
