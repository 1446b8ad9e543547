"""What a strategy does to one model, without training it (``hotloop explain``).

Builds the step the Trainer would build (:func:`hotloop.engine.build.build_step`),
applies the device flags and runs the step once on one real batch, then prints
the effective strategy, the device flags set, every graph pass with its match
counts, captures, graph breaks and fallbacks with reasons, and memory estimates.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch
from torch import nn

from ..hparams import HParams
from ..problems.base import Batch
from .capture import CaptureError, capture_joint
from .flags import apply_device_flags
from .build import build_step
from .precision import Precision
from .step_parts import default_loss_fn
from .strategy import Strategy

__all__ = ["explain"]


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def explain(model: nn.Module, hp: HParams, strategy: Strategy, batch: Batch, device: torch.device | str,
            out: Any = None) -> None:
    """Print what ``strategy`` does to ``model`` (one step on ``batch``) to ``out`` (default: stdout)."""
    device = torch.device(device)
    strategy.validate(device)
    model.to(device)
    batch = {k: v.to(device) for k, v in batch.items()}

    def say(line: str = "") -> None:
        print(line, file=out or sys.stdout)

    say("== effective strategy ==")
    default = Strategy()
    for f in dataclasses.fields(strategy):
        value = getattr(strategy, f.name)
        mark = "" if value == getattr(default, f.name) else "   (override)"
        say(f"  {f.name} = {value!r}{mark}")
    say("== device flags ==")
    for line in apply_device_flags(strategy, device).lines():
        say(f"  {line}")
    step = build_step(model, hp, strategy).step
    rows = next(iter(batch.values())).shape[0]
    state = model.initial_state(rows, device) if hasattr(model, "initial_state") else None
    step([batch], state)
    say("== step ==")
    say(f"  backend={strategy.backend} executor={strategy.executor} precision={strategy.precision}")
    for line in step.report:
        say(f"  {line}")
    say(f"  fallback: {step.fallback_reason or 'none'}")
    graphs = step.captured_graphs() if hasattr(step, "captured_graphs") else []
    say("== graph passes ==")
    if not graphs:
        say("  none (passes run only on backend=graph captures)")
    for i, g in enumerate(graphs):
        say(f"  graph #{i + 1}: {g.nodes_captured} nodes captured -> {len(g.gm.graph.nodes)} after passes")
        for r in g.passes:
            say(f"    {r.line()}")
    say("== memory estimates ==")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    slots = {"adam": 2, "adamw": 2, "momentum": 1}.get(hp.optimizer, 0)
    say(f"  parameters: {sum(p.numel() for p in model.parameters()):,} ({_mb(params)}); "
        f"gradients {_mb(params)}; optimizer state {_mb(params * slots)} ({hp.optimizer})")
    analysis = graphs[0] if graphs else None
    if analysis is None:
        try:
            analysis = capture_joint(model, default_loss_fn, batch, state,
                                     Precision(strategy.precision, next(model.parameters()).device), [])
        except CaptureError as exc:
            say(f"  activations: unknown ({exc.reason})")
    if analysis is not None:
        critical, width = analysis.parallelism()
        say(f"  activations (peak live intermediates of the joint graph): "
            f"{_mb(analysis.activation_peak_bytes())}")
        say(f"  graph shape: {critical} ops on the critical path, {width:.2f} ops per level on average")
