"""Building the step: :func:`build_step` is the one way to make one.

From (model, hparams, Strategy) it makes the optimizer(s), the layout, the
formulation, the :class:`~hotloop.engine.precision.Precision`, the data-parallel
wrap and the backend, and returns the :class:`~hotloop.engine.step.TrainStep`.
The Trainer, the autotuner's trials, ``hotloop profile``, ``hotloop explain`` and
the parity check all call it, so each runs the step the Trainer runs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..hparams import HParams
from ..optim import build_optimizer, fused_kernel_available, sparse_gradient_modules
from ..param_groups import param_groups
from ..problems.base import Batch
from .activation_ckpt import set_activation_checkpointing
from .backends import Backend, EagerBackend
from .conv_formulations import use_conv_formulations
from .linear_formulations import use_linear_gemm
from .norm_formulations import use_batch_norm, use_instance_norm
from .dropout_masks import use_dropout_masks
from .precision import Precision
from .precision_notices import precision_notices
from .program import PhaseOptimizers, model_phases
from .step import TrainStep, one_phase
from .step_parts import LossFn, Phase, default_loss_fn
from .strategy import Strategy, StrategyError, validate_for_model

__all__ = ["BuiltStep", "build_step", "compile_step", "OptimizerFactory", "WrapFn", "wire_fused_optimizer",
           "make_backend"]

#: ``factory(params, fused) -> optimizer`` for callers whose optimizer is not described by hparams
OptimizerFactory = Callable[[list[nn.Parameter], bool], torch.optim.Optimizer]
#: ``wrap(model, optimizer) -> (train model, optimizer, no_sync)``: the data-parallel hook
WrapFn = Callable[[nn.Module, torch.optim.Optimizer], tuple[nn.Module, torch.optim.Optimizer, Any]]


@dataclass
class BuiltStep:
    """What :func:`build_step` made: call ``step(micro_batches, state)`` once per optimizer step."""

    step: TrainStep
    optimizer: Any                            # the one to step (a sharded wrapper under Reduce mode)
    model: nn.Module                          # the model the step trains (wrapped for data parallel)
    precision: Precision                      # autocast and loss scaling (its state goes into checkpoints)


def channels_last_batch(batch: Batch) -> Batch:
    """``batch`` with its 4-D floating tensors in channels_last layout (the others as they are)."""
    return {k: v.contiguous(memory_format=torch.channels_last)
            if v.dim() == 4 and v.is_floating_point() else v for k, v in batch.items()}


def wire_fused_optimizer(optimizer: torch.optim.Optimizer, fused: bool, kernel: bool = False) -> list[str]:
    """Make the optimizer's multi-tensor mode follow ``Strategy.fused_optimizer``; report changes.

    ``fused=True`` keeps a ``fused`` kernel if the optimizer was built with one, else
    turns on ``foreach``; with ``kernel=True`` (``Strategy.fused_kernel``) a group whose optimizer
    class, dtypes and devices torch has a one-kernel update for switches to it (``fused=True``);
    ``fused=False`` selects the per-tensor loop.
    """
    changes: list[str] = []
    for i, group in enumerate(getattr(optimizer, "param_groups", None) or []):
        if not isinstance(group, dict):
            continue
        if fused and kernel and not group.get("fused") and "fused" in group \
                and fused_kernel_available(type(optimizer), group.get("params", [])):
            changes.append(f"optimizer: param_group[{i}].fused: {group['fused']} -> True (one-kernel update)")
            group["fused"] = True
        want_foreach = fused and not group.get("fused")
        if "foreach" in group and bool(group["foreach"]) != want_foreach:
            changes.append(f"optimizer: param_group[{i}].foreach: {group['foreach']} -> {want_foreach}")
            group["foreach"] = want_foreach
        if not fused and group.get("fused"):
            changes.append(f"optimizer: param_group[{i}].fused: True -> False")
            group["fused"] = False
    return changes


def make_backend(strategy: Strategy, model: nn.Module, precision: Precision, *, phases: int,
                 data_parallel: bool, report: list[str]) -> Backend:
    """The backend ``strategy.backend`` names. Inductor compiles a phased step's networks, or the
    ``compile_units()`` a model names, one by one (:mod:`hotloop.engine.compiled_networks`), and
    any other step's whole loss; under the graph backend a phased step runs eagerly, and says so."""
    if strategy.backend == "graph" and phases > 1:
        backend = EagerBackend(report)
        backend.fall_back(f"fallback: a step of {phases} phases runs eagerly (backend={strategy.backend})")
        return backend
    if strategy.backend == "graph":
        from .graph_backend import GraphBackend
        return GraphBackend(model, strategy, precision, data_parallel=data_parallel, report=report)
    if strategy.backend == "inductor":
        from .compiled_networks import compile_networks, names_units
        from .inductor_backend import InductorBackend
        return InductorBackend(precision.device, strategy.cuda_graphs, report,
                               networks=compile_networks(model) if phases > 1 or names_units(model) else None)
    return EagerBackend(report)


def compile_step(model: nn.Module, loss_fn: LossFn | None, optimizer: torch.optim.Optimizer,
                 strategy: Strategy, *, phases: Sequence[Phase] | None = None,
                 phase_optimizers: Sequence[torch.optim.Optimizer] | None = None,
                 precision: Precision | None = None, max_grad_norm: float = 0.0,
                 no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                 clip_via_lr: bool = False, report: Sequence[str] = (),
                 notices: Sequence[str] = ()) -> TrainStep:
    """The :class:`TrainStep` for ``strategy`` over an optimizer already built (``build_step``
    validates the strategy and builds the optimizer first; tests and benchmarks call this
    directly). One-loss models pass ``loss_fn`` (default ``model.loss``); phased models pass
    ``phases`` with one optimizer each. ``report`` and ``notices`` open the step's own lists.
    """
    lines = list(report)
    for opt in (phase_optimizers or [optimizer]):
        lines += wire_fused_optimizer(opt, strategy.fused_optimizer, strategy.fused_kernel)
    if phases is None:
        phases = one_phase(loss_fn or default_loss_fn, model)
        phase_optimizers = [optimizer]
    if strategy.channels_last:
        model.to(memory_format=torch.channels_last)   # parameters keep their identity
        lines.append("layout: model and 4-D float inputs converted to channels_last")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    precision = precision or Precision(strategy.precision, device)
    backend = make_backend(strategy, model, precision, phases=len(phases), data_parallel=no_sync is not None,
                           report=lines)
    step = TrainStep(model, phases, optimizer, list(phase_optimizers or [optimizer]), precision,
                     backend=backend, max_grad_norm=max_grad_norm, no_sync=no_sync, clip_via_lr=clip_via_lr,
                     report=lines, inputs=channels_last_batch if strategy.channels_last else None)
    step.notices.extend(notices)
    return step


def _use_formulation(model: nn.Module, strategy: Strategy) -> list[str]:
    """Hand the Strategy's formulation to a model that reads one; the report lines."""
    use = getattr(model, "use_formulation", None)
    if use is None:
        return []
    use(strategy.formulation)
    changed = strategy.formulation.changed()
    return [f"formulation: {', '.join(f'{k}={v}' for k, v in changed.items())}"] if changed else []


def _checkpoint_blocks(model: nn.Module, strategy: Strategy) -> list[str]:
    """Turn the Strategy's activation checkpointing on or off on ``model``'s blocks; the report lines."""
    blocks = set_activation_checkpointing(model, strategy.activation_checkpointing)
    if not strategy.activation_checkpointing:
        return []
    if not blocks:
        return ["activation checkpointing: the model names no blocks (nothing recomputed)"]
    kinds = sorted({type(b).__name__ for b in blocks})
    return [f"activation checkpointing: {len(blocks)} blocks ({', '.join(kinds)}) recomputed in backward"]


def build_step(model: nn.Module, hp: HParams, strategy: Strategy, *, loss_fn: LossFn | None = None,
               optimizer: OptimizerFactory | None = None, wrap: WrapFn | None = None,
               max_grad_norm: float | None = None) -> BuiltStep:
    """Build the optimizer(s) (``hp.optimizer``, or ``optimizer(params, fused)``) and the step for
    ``strategy``: formulation, layout, fused update, precision, data-parallel wrap, backend.

    ``max_grad_norm`` defaults to ``hp.max_grad_norm``. Raises
    :class:`~hotloop.engine.strategy.StrategyError` for settings that do not fit the model.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    strategy.validate(device)
    validate_for_model(strategy, model)
    report = (_use_formulation(model, strategy) + use_dropout_masks(model, strategy.dropout_masks)
              + use_conv_formulations(model, strategy.dilated_conv_wgrad, strategy.pointwise_conv)
              + use_instance_norm(model, strategy.instance_norm, strategy.channels_last)
              + use_batch_norm(model, strategy.batch_norm)
              + use_linear_gemm(model, strategy.linear_gemm)
              + _checkpoint_blocks(model, strategy))
    notices = precision_notices(strategy.precision, device, model)
    if strategy.channels_last:
        model.to(memory_format=torch.channels_last)   # before the optimizer: parameters keep identity
    clip = hp.max_grad_norm if max_grad_norm is None else max_grad_norm
    precision = Precision(strategy.precision, device)
    fused = strategy.fused_optimizer
    phases = model_phases(model) if loss_fn is None else None
    if phases:
        if wrap is not None and getattr(getattr(wrap, "__self__", None), "world_size", 2) > 1:
            raise StrategyError(f"{type(model).__name__} trains in phases ({', '.join(p.name for p in phases)}); "
                                "data-parallel runs of phased steps are not supported: use one process")
        optimizers = {p.name: optimizer(list(p.parameters), fused) if optimizer is not None
                      else build_optimizer(p.parameters, hp, fused=fused) for p in phases}
        held = PhaseOptimizers(optimizers)
        step = compile_step(model, None, held, strategy, phases=phases, phase_optimizers=list(optimizers.values()),
                            precision=precision, max_grad_norm=clip, clip_via_lr=strategy.clip_via_lr,
                            report=report, notices=notices)
        return BuiltStep(step, held, model, precision)
    if optimizer is not None:
        opt = optimizer(params, fused)
    else:
        opt = build_optimizer(param_groups(model, hp), hp, fused=fused, sparse=bool(sparse_gradient_modules(model)))
    train_model, opt, no_sync = wrap(model, opt) if wrap is not None else (model, opt, None)
    step = compile_step(train_model, loss_fn, opt, strategy, precision=precision, max_grad_norm=clip,
                        no_sync=no_sync, clip_via_lr=strategy.clip_via_lr, report=report, notices=notices)
    return BuiltStep(step, opt, train_model, precision)
