"""The training step: one builder, and the whole step as one callable.

:func:`build_step` is the one way to build a step: the optimizer, layout, loss
scaling, data-parallel wrap and the backend's compiled step (:func:`compile_step`)
from (model, hparams, Strategy). The Trainer, the autotuner's trials, ``hotloop
profile``, ``hotloop explain`` and the parity check all call it, so each runs the
step the Trainer runs. A step (forward, loss, backward, clip, update) never reads
a value back to the host: the loss and statistics stay tensors, so the trainer
decides when to synchronise (``Strategy.sync_every``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..models.base import LossOutput
from ..optim import build_optimizer, sparse_gradient_modules
from ..problems.base import Batch
from .clipping import clip_grad_norm, clip_via_lr, clip_via_lr_unavailable
from .host_memory import keep_freed_memory
from .precision_notices import precision_notices
from .strategy import Strategy, StrategyError, validate_for_model

__all__ = ["BuiltStep", "build_step", "OptimizerFactory", "WrapFn", "LossFn", "PhaseHook", "StepResult",
           "TrainStep", "compile_step", "autocast_context",
           "detach_state", "default_loss_fn", "weighted_loss_fn", "wire_fused_optimizer", "clip_grad_norm",
           "ACCUM_WEIGHT"]

LossFn = Callable[[nn.Module, Batch, Any], LossOutput]
#: ``hook(phase) -> context manager`` around each phase of a step ("forward", "backward",
#: "forward_backward" for captured graphs, "optimizer"); the profiler times and annotates with it
PhaseHook = Callable[[str], contextlib.AbstractContextManager]
#: the statistic that carries a micro-batch's accumulation weight through every backend
ACCUM_WEIGHT = "_accum_weight"


@dataclass
class StepResult:
    loss: Tensor                 # detached mean loss over the micro-batches
    stats: dict[str, Tensor]     # summed statistics (no host sync)
    state: Any                   # carried model state, detached
    grad_norm: Tensor | None     # pre-clip global grad norm when clipping


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def detach_state(state: Any) -> Any:
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, (tuple, list)):
        return type(state)(detach_state(s) for s in state)
    if isinstance(state, dict):
        return {k: detach_state(v) for k, v in state.items()}
    return state


def default_loss_fn(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
    return model.loss(batch, state)  # type: ignore[operator]


def _no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def weighted_loss_fn(loss_fn: LossFn) -> LossFn:
    """``loss_fn`` for one micro-batch of an accumulated step: the mean loss times its weight.

    The weight is ``LossOutput.weight`` (what the mean is over, e.g. non-pad tokens), or 1
    when the model gives none; it travels as the statistic :data:`ACCUM_WEIGHT` so every
    backend (eager, captured graph, inductor) returns it. The step divides the summed
    gradients by the summed weights, so k micro-batches give the gradient of one batch
    of their concatenation.
    """
    def weighted(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
        out = loss_fn(model, batch, state)
        weight = out.weight if out.weight is not None else out.loss.new_ones(())
        stats = dict(out.stats)
        stats[ACCUM_WEIGHT] = weight
        return LossOutput(out.loss * weight, stats, out.state, out.logits, weight)
    return weighted


class TrainStep:
    """Eager whole-step callable: ``step(micro_batches, state) -> StepResult``.

    Gradient accumulation: pass several micro-batches; each micro-loss is weighted by
    what its mean is over (:func:`weighted_loss_fn`) and the summed gradients are divided
    by the total weight, on the device (no host sync). ``phase`` (a :data:`PhaseHook`)
    wraps each phase; the default does nothing.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, optimizer: torch.optim.Optimizer,
                 strategy: Strategy, *, max_grad_norm: float = 0.0,
                 grad_scaler: "torch.amp.GradScaler | None" = None,
                 no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                 clip_via_lr: bool = False) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.strategy = strategy
        self.max_grad_norm = max_grad_norm
        self.grad_scaler = grad_scaler
        self.no_sync = no_sync
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.fallback_reason: str | None = None
        self.report: list[str] = []
        self.notices: list[str] = []       # what the user must be told (the Trainer shows these)
        self.phase: PhaseHook = _no_phase
        self.clip_via_lr = False
        if clip_via_lr and max_grad_norm > 0 and grad_scaler is None:
            unavailable = clip_via_lr_unavailable(optimizer, self.device)
            self.clip_via_lr = unavailable is None
            self.report.append("clip: folded into the SGD learning rate" if unavailable is None
                               else f"clip: not folded into the learning rate ({unavailable})")

    def micro_loss_fn(self, n: int) -> LossFn:
        """The loss function for a step of ``n`` micro-batches."""
        return self.loss_fn if n == 1 else weighted_loss_fn(self.loss_fn)

    def __call__(self, micro_batches: Sequence[Batch], state: Any = None) -> StepResult:
        n = len(micro_batches)
        if n == 0:
            raise ValueError("step() needs at least one micro-batch")
        loss_fn = self.micro_loss_fn(n)
        total_loss: Tensor | None = None
        stats: dict[str, Tensor] = {}
        for i, batch in enumerate(micro_batches):
            last = i == n - 1
            sync_ctx = self.no_sync() if (self.no_sync is not None and not last) else contextlib.nullcontext()
            with sync_ctx:
                with self.phase("forward"), autocast_context(self.strategy.precision, self.device):
                    out = loss_fn(self.model, batch, state)
                with self.phase("backward"):
                    if self.grad_scaler is not None:
                        self.grad_scaler.scale(out.loss).backward()
                    else:
                        out.loss.backward()
            state = detach_state(out.state)
            total_loss = out.loss.detach() if total_loss is None else total_loss + out.loss.detach()
            for k, v in out.stats.items():
                stats[k] = v if k not in stats else stats[k] + v
        assert total_loss is not None
        total_loss = self.finish_accumulation(total_loss, stats, n)
        return StepResult(total_loss, stats, state, self.finish_step())

    def finish_accumulation(self, total_loss: Tensor, stats: dict[str, Tensor], n: int) -> Tensor:
        """After ``n > 1`` weighted micro-batches: divide the gradients and the loss by the total
        weight (popped from ``stats``); returns the step's mean loss. Identity for ``n == 1``."""
        if n == 1:
            return total_loss
        weight = stats.pop(ACCUM_WEIGHT).to(total_loss.dtype).clamp(min=1)   # [] on the device
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_div_(grads, weight)
        return total_loss / weight

    def finish_step(self) -> Tensor | None:
        """Clip, update and zero the gradients; return the pre-clip norm (when clipping)."""
        with self.phase("optimizer"):
            if self.clip_via_lr:
                grad_norm = clip_via_lr(self.optimizer, self.params, self.max_grad_norm)
                self.optimizer.zero_grad(set_to_none=True)
                return grad_norm
            grad_norm = self._clip()
            if self.grad_scaler is not None:
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _clip(self) -> Tensor | None:
        if self.max_grad_norm <= 0:
            return None
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)
        return clip_grad_norm(self.params, self.max_grad_norm)


def _channels_last_inputs(loss_fn: LossFn) -> LossFn:
    """Wrap ``loss_fn`` so 4-D floating batch tensors arrive in channels_last layout."""
    def wrapped(model: nn.Module, batch: Batch, state: Any) -> LossOutput:
        batch = {k: v.contiguous(memory_format=torch.channels_last)
                 if v.dim() == 4 and v.is_floating_point() else v for k, v in batch.items()}
        return loss_fn(model, batch, state)
    return wrapped


def wire_fused_optimizer(optimizer: torch.optim.Optimizer, fused: bool) -> list[str]:
    """Make the optimizer's multi-tensor mode follow ``Strategy.fused_optimizer``; report changes.

    ``fused=True`` keeps a ``fused`` kernel if the optimizer was built with one, else
    turns on ``foreach``; ``fused=False`` selects the per-tensor loop.
    """
    changes: list[str] = []
    for i, group in enumerate(getattr(optimizer, "param_groups", None) or []):
        if not isinstance(group, dict):
            continue
        want_foreach = fused and not group.get("fused")
        if "foreach" in group and bool(group["foreach"]) != want_foreach:
            changes.append(f"optimizer: param_group[{i}].foreach: {group['foreach']} -> {want_foreach}")
            group["foreach"] = want_foreach
        if not fused and group.get("fused"):
            changes.append(f"optimizer: param_group[{i}].fused: True -> False")
            group["fused"] = False
    return changes


def compile_step(model: nn.Module, loss_fn: LossFn | None, optimizer: torch.optim.Optimizer,
                 strategy: Strategy, *, report: Sequence[str] = (), notices: Sequence[str] = (),
                 **kwargs: Any) -> TrainStep:
    """The whole-step callable for ``strategy`` (called by :func:`build_step`,
    which validates the strategy and builds the optimizer first).

    ``backend="eager"``: :class:`TrainStep`. ``"graph"``: the step is captured as one
    forward+backward FX graph, rewritten by hotloop's passes and run by hotloop's
    executor (``GraphTrainStep``). ``"inductor"``: the loss is ``torch.compile``d.
    Both capture backends fall back to eager, recording why in ``step.fallback_reason``.
    ``report`` and ``notices`` (lines from the builder) open the step's own lists.
    """
    # process-wide, once: the step's large buffers stop page-faulting (engine/host_memory.py)
    changes = wire_fused_optimizer(optimizer, strategy.fused_optimizer) + [keep_freed_memory()]
    loss_fn = loss_fn or default_loss_fn
    if strategy.channels_last:
        model.to(memory_format=torch.channels_last)   # parameters keep their identity
        loss_fn = _channels_last_inputs(loss_fn)
        changes.append("layout: model and 4-D float inputs converted to channels_last")
    if strategy.backend == "graph":
        from .graph_step import GraphTrainStep
        step: TrainStep = GraphTrainStep(model, loss_fn, optimizer, strategy, **kwargs)
    elif strategy.backend == "inductor":
        from .inductor_step import InductorTrainStep
        step = InductorTrainStep(model, loss_fn, optimizer, strategy, **kwargs)
    else:
        step = TrainStep(model, loss_fn, optimizer, strategy, **kwargs)
    step.report[:0] = list(report)
    step.report.extend(changes)
    step.notices.extend(notices)
    return step


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
    formulation = _use_formulation(model, strategy)
    notices = precision_notices(strategy.precision, device, model)
    if strategy.channels_last:
        model.to(memory_format=torch.channels_last)   # before the optimizer: parameters keep identity
    from .program import model_phases
    phases = model_phases(model) if loss_fn is None else None
    if phases:
        built = _build_program(model, hp, strategy, phases, optimizer, wrap, max_grad_norm, device)
        built.step.notices.extend(notices)
        return built
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
                        no_sync=no_sync, clip_via_lr=strategy.clip_via_lr, report=formulation, notices=notices)
    return BuiltStep(step, opt, train_model, scaler)


def _use_formulation(model: nn.Module, strategy: Strategy) -> list[str]:
    """Hand the Strategy's formulation to a model that reads one; the report lines."""
    use = getattr(model, "use_formulation", None)
    if use is None:
        return []
    use(strategy.formulation)
    changed = strategy.formulation.changed()
    return [f"formulation: {', '.join(f'{k}={v}' for k, v in changed.items())}"] if changed else []


def _build_program(model: nn.Module, hp: HParams, strategy: Strategy, phases: list[Any],
                   optimizer: OptimizerFactory | None, wrap: WrapFn | None, max_grad_norm: float | None,
                   device: torch.device) -> BuiltStep:
    """A phased model (e.g. a GAN): one optimizer per phase and a :class:`ProgramStep`."""
    from .program import Phase, PhaseOptimizers, ProgramStep
    if wrap is not None and getattr(getattr(wrap, "__self__", None), "world_size", 2) > 1:
        raise StrategyError(f"{type(model).__name__} trains in phases ({', '.join(p.name for p in phases)}); "
                            "data-parallel runs of phased steps are not supported: use one process")
    fused = strategy.fused_optimizer
    optimizers = {p.name: optimizer(list(p.parameters), fused) if optimizer is not None
                  else build_optimizer(p.parameters, hp, fused=fused) for p in phases}
    report = [line for opt in optimizers.values() for line in wire_fused_optimizer(opt, fused)]
    report.append(keep_freed_memory())
    if strategy.clip_via_lr:
        report.append("clip: not folded into the learning rate (a phased step clips each phase's gradients)")
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
