"""``backend="inductor"``: the forward + loss is ``torch.compile``d (AOT autograd compiles the backward).

A step of several phases (a GAN), or of a model that names its ``compile_units()``, compiles
those units one by one instead, and runs the rest of each loss (a GAN's pools of fakes and their
random draws) eagerly around them (:mod:`hotloop.engine.compiled_networks`).

Clipping and the optimizer update stay eager (multi-tensor kernels), in the one
step. Graph breaks are counted from dynamo's counters after the first call; if
compiling fails (no C++ compiler, an unsupported op) the micro-batch runs
eagerly and ``fallback_reason`` says why. ``cuda_graphs=True`` adds CUDA graphs (what the
``reduce-overhead`` mode sets). Random ops in the compiled code call aten's kernels
(:data:`DRAWS_LIKE_EAGER`): a compiled step draws the numbers the eager step draws (dropout masks
included), so it trains as the eager step does and the parity check judges it as any reordering.
The generated code is cached on disk between runs (:mod:`hotloop.engine.compile_cache`);
``compile_stats`` says what the first call cost and whether its code was compiled or loaded from
that cache.
"""
from __future__ import annotations

import shutil
from typing import Any, Callable

import torch
from torch import nn

from ..models.base import LossOutput
from ..problems.base import Batch
from .backends import EagerBackend, ForwardBackward
from .compile_cache import CompileStats, measure_compile, use_compile_cache
from .compiled_networks import CompiledNetworks
from .precision import Precision
from .step_parts import LossFn, PhaseHook

__all__ = ["InductorBackend", "DRAWS_LIKE_EAGER", "inductor_options"]

#: inductor's setting for every compile here: random ops fall back to aten's, in eager's stream
DRAWS_LIKE_EAGER: dict[str, Any] = {"fallback_random": True}


def inductor_options(cuda_graphs: bool) -> dict[str, Any]:
    """``torch.compile(options=...)``: eager's random numbers, and CUDA graphs when asked."""
    return {**DRAWS_LIKE_EAGER, **({"triton.cudagraphs": True} if cuda_graphs else {})}


class InductorBackend(EagerBackend):
    """The eager backend with each loss function ``torch.compile``d once, or, given ``networks``
    (a phased step), each of those modules compiled and the loss functions run eagerly around them."""

    name = "inductor"

    def __init__(self, device: torch.device, cuda_graphs: bool, report: list[str] | None = None,
                 networks: list[nn.Module] | None = None) -> None:
        super().__init__(report)
        self.options = inductor_options(cuda_graphs)
        self.compiled: dict[int, Callable[..., LossOutput]] = {}     # id(loss_fn) -> compiled loss
        self.graph_breaks = 0
        self.compile_stats: CompileStats | None = None      # every first call's compilation (None before one)
        self.networks: CompiledNetworks | None = None
        if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
            self.fall_back("fallback: inductor on CPU needs a C++ compiler (none on PATH)")
            return
        use_compile_cache()
        if networks is not None:
            self.networks = CompiledNetworks(networks, self.options)
            self.report.append(f"inductor: {self.networks.describe()}; the losses' own code runs eagerly")

    def _compile(self, loss_fn: LossFn) -> Callable[..., LossOutput]:
        if self.networks is not None:
            active = self.networks.active

            def with_compiled_networks(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
                with active():
                    return loss_fn(model, batch, state)
            return with_compiled_networks

        def forward(m: nn.Module, batch: Batch, state: Any) -> tuple:
            out = loss_fn(m, batch, state)
            return out.loss, out.stats, out.state, out.weight

        compiled_fn = torch.compile(forward, options=self.options)

        def compiled_loss(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
            loss, stats, new_state, weight = compiled_fn(model, batch, state)
            return LossOutput(loss, stats, new_state, weight=weight)
        return compiled_loss

    def forward_backward(self, model: nn.Module, loss_fn: LossFn, batch: Batch, state: Any, weighted: bool,
                         precision: Precision, phase: PhaseHook) -> ForwardBackward:
        if self.fallback_reason:
            return super().forward_backward(model, loss_fn, batch, state, weighted, precision, phase)
        key = id(loss_fn)
        if key in self.compiled:
            return super().forward_backward(model, self.compiled[key], batch, state, weighted, precision, phase)
        from torch._dynamo.utils import counters
        before = sum(counters["graph_break"].values())
        compiled = self._compile(loss_fn)
        try:      # the first call compiles forward and backward (AOT autograd) before any gradient
            with measure_compile() as stats:
                out = self.forward(model, compiled, batch, state, precision, phase)
        except Exception as exc:  # noqa: BLE001 - any compile failure falls back to eager
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.fall_back(f"fallback: torch.compile failed: {type(exc).__name__}: {first[:200]}")
            return super().forward_backward(model, loss_fn, batch, state, weighted, precision, phase)
        self.compiled[key] = compiled
        with measure_compile() as backward_stats:     # a backward compiled lazily is counted too
            result = self.backward(out, precision, phase)
        stats.merge(backward_stats)
        self.graph_breaks = sum(counters["graph_break"].values()) - before
        if self.compile_stats is None:
            self.compile_stats = stats
        else:             # a second loss function (another phase, or accumulation's weighted one)
            self.compile_stats.merge(stats)
        self.report.append(f"inductor: {stats.line()}, {self.graph_breaks} graph break(s)")
        for reason, count in counters["graph_break"].items():
            self.report.append(f"graph break x{count}: {str(reason).splitlines()[0][:160]}")
        return result
