"""The one way to build a training step: optimizer, wrappers and compiled step from a Strategy.

``build_step(model, hp, strategy)`` is what the Trainer, the autotuner's trials,
``hotloop profile``, ``hotloop explain`` and the parity check all call, so each of
them runs the step the Trainer runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..hparams import HParams
from ..optim import build_optimizer, sparse_gradient_modules
from .program import Phase, PhaseOptimizers, ProgramStep, model_phases
from .step import LossFn, TrainStep, _channels_last_inputs, compile_step, wire_fused_optimizer
from .strategy import Strategy, StrategyError, validate_for_model

__all__ = ["BuiltStep", "build_step", "OptimizerFactory", "WrapFn"]

#: ``factory(params, fused) -> optimizer`` for callers whose optimizer is not described by hparams
OptimizerFactory = Callable[[list[nn.Parameter], bool], torch.optim.Optimizer]
#: ``wrap(model, optimizer) -> (train model, optimizer, no_sync)``: the data-parallel hook
WrapFn = Callable[[nn.Module, torch.optim.Optimizer], tuple[nn.Module, torch.optim.Optimizer, Any]]


@dataclass
class BuiltStep:
    """What :func:`build_step` made: call ``step(micro_batches, state)`` once per optimizer step."""

    step: TrainStep
    optimizer: torch.optim.Optimizer          # the one to step (a sharded wrapper under Reduce mode)
    model: nn.Module                          # the model the step trains (wrapped for data parallel)
    grad_scaler: "torch.amp.GradScaler | None"


def build_step(model: nn.Module, hp: HParams, strategy: Strategy, *, loss_fn: LossFn | None = None,
               optimizer: OptimizerFactory | None = None, wrap: WrapFn | None = None,
               max_grad_norm: float | None = None) -> BuiltStep:
    """Build the optimizer (``hp.optimizer``, or ``optimizer(params, fused)``) and the compiled
    step for ``strategy``: layout, fused update, fp16 loss scaling on CUDA, data-parallel wrap.

    ``max_grad_norm`` defaults to ``hp.max_grad_norm``. Raises
    :class:`~hotloop.engine.strategy.StrategyError` for settings that do not fit the model.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    strategy.validate(device)
    validate_for_model(strategy, model)
    if strategy.channels_last:
        model.to(memory_format=torch.channels_last)   # before the optimizer: parameters keep identity
    phases = model_phases(model) if loss_fn is None else None
    if phases:
        return _build_program(model, hp, strategy, phases, optimizer, wrap, max_grad_norm, device)
    if optimizer is not None:
        opt = optimizer(params, strategy.fused_optimizer)
    else:
        sparse = bool(sparse_gradient_modules(model))
        opt = build_optimizer(params, hp, fused=strategy.fused_optimizer, sparse=sparse)
    scaler = (torch.amp.GradScaler("cuda")
              if strategy.precision == "fp16" and device.type == "cuda" else None)
    train_model, opt, no_sync = wrap(model, opt) if wrap is not None else (model, opt, None)
    clip = hp.max_grad_norm if max_grad_norm is None else max_grad_norm
    step = compile_step(train_model, loss_fn, opt, strategy, max_grad_norm=clip, grad_scaler=scaler,
                        no_sync=no_sync)
    return BuiltStep(step, opt, train_model, scaler)


def _build_program(model: nn.Module, hp: HParams, strategy: Strategy, phases: list[Phase],
                   optimizer: OptimizerFactory | None, wrap: WrapFn | None, max_grad_norm: float | None,
                   device: torch.device) -> BuiltStep:
    """A phased model (e.g. a GAN): one optimizer per phase and a :class:`ProgramStep`."""
    if wrap is not None and getattr(getattr(wrap, "__self__", None), "world_size", 2) > 1:
        raise StrategyError(f"{type(model).__name__} trains in phases ({', '.join(p.name for p in phases)}); "
                            "data-parallel runs of phased steps are not supported: use one process")
    fused = strategy.fused_optimizer
    optimizers = {p.name: optimizer(list(p.parameters), fused) if optimizer is not None
                  else build_optimizer(p.parameters, hp, fused=fused) for p in phases}
    report = [line for opt in optimizers.values() for line in wire_fused_optimizer(opt, fused)]
    if strategy.channels_last:
        phases = [Phase(p.name, _channels_last_inputs(p.loss_fn), p.parameters) for p in phases]
        report.append("layout: model and 4-D float inputs converted to channels_last")
    scaler = (torch.amp.GradScaler("cuda")
              if strategy.precision == "fp16" and device.type == "cuda" else None)
    opt = PhaseOptimizers(optimizers)
    clip = hp.max_grad_norm if max_grad_norm is None else max_grad_norm
    step = ProgramStep(model, phases, opt, strategy, max_grad_norm=clip, grad_scaler=scaler)
    step.report.extend(report)
    return BuiltStep(step, opt, model, scaler)  # type: ignore[arg-type]
