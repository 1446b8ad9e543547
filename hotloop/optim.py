"""Registered optimizers and learning-rate schedules.

An optimizer factory is ``fn(params, hp, fused) -> torch.optim.Optimizer``;
``fused=True`` selects multi-tensor kernels (``foreach``, or ``fused`` where
the build supports it for the parameters' device).

A schedule is an object with ``multiplier(step, epoch) -> float``, an optional
``on_eval(metric)`` hook (plateau decay) and ``state_dict``/``load_state_dict``.
The trainer sets ``lr = hp.learning_rate * multiplier`` before every step
(a Python float: no device sync).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from .errors import StrategyError
from .hparams import HParams
from .registry import lr_schedules, optimizers

__all__ = ["build_optimizer", "build_schedule", "LRSchedule", "sparse_gradient_modules"]


def _multi_tensor(params: list, fused: bool) -> dict[str, bool]:
    """``fused`` kernels on CUDA; ``foreach`` (multi-tensor) elsewhere; per-tensor loop if off.
    ``params`` are parameters or param groups (dicts with ``"params"``)."""
    if not fused:
        return {"foreach": False}
    on_cuda = any(p.is_cuda for item in params
                  for p in (item["params"] if isinstance(item, dict) else [item]))
    return {"fused": True} if on_cuda else {"foreach": True}


@optimizers.register("sgd")
def sgd(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=hp.learning_rate, weight_decay=hp.weight_decay,
                           **_multi_tensor(params, fused))


@optimizers.register("momentum")
def momentum(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=hp.learning_rate, momentum=hp.momentum,
                           weight_decay=hp.weight_decay, **_multi_tensor(params, fused))


@optimizers.register("adam")
def adam(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=hp.learning_rate, betas=(hp.adam_beta1, hp.adam_beta2),
                            eps=hp.adam_epsilon, weight_decay=hp.weight_decay,
                            **_multi_tensor(params, fused))


@optimizers.register("adamw")
def adamw(params: list, hp: HParams, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=hp.learning_rate, betas=(hp.adam_beta1, hp.adam_beta2),
                             eps=hp.adam_epsilon, weight_decay=hp.weight_decay,
                             **_multi_tensor(params, fused))


def sparse_gradient_modules(model: torch.nn.Module) -> list[str]:
    """Names of modules that produce sparse gradients (``Embedding``/``EmbeddingBag(sparse=True)``)."""
    return [name or type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse]


def build_optimizer(params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], hp: HParams, *,
                    fused: bool = True, sparse: bool = False) -> torch.optim.Optimizer:
    """``hp.optimizer`` over ``params``: parameters, or param groups (:mod:`hotloop.param_groups`)
    whose own settings (``weight_decay``, ``lr``, ``lr_scale``) override the hparams'."""
    items = list(params)
    if items and isinstance(items[0], dict):
        groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in items]
        params = [g for g in groups if g["params"]]
    else:
        params = [p for p in items if p.requires_grad]
    if fused and sparse:
        raise StrategyError("fused_optimizer=True cannot update sparse gradients; "
                            "set fused_optimizer=False or use dense embeddings")
    return optimizers.get(hp.optimizer)(params, hp, fused)


class LRSchedule:
    """Base schedule: constant multiplier 1."""

    def __init__(self, hp: HParams, steps_per_epoch: int | None = None) -> None:
        self.hp = hp
        self.steps_per_epoch = steps_per_epoch

    def multiplier(self, step: int, epoch: int) -> float:
        return 1.0

    def on_eval(self, metric: float) -> None:
        """Called with the validation loss after each evaluation."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _warmup(hp: HParams, step: int) -> float:
    return min(1.0, (step + 1) / hp.warmup_steps) if hp.warmup_steps > 0 else 1.0


@lr_schedules.register("constant")
class Constant(LRSchedule):
    def multiplier(self, step: int, epoch: int) -> float:
        return _warmup(self.hp, step)


@lr_schedules.register("rsqrt_decay")
class RsqrtDecay(LRSchedule):
    """Linear warmup then 1/sqrt(step) decay (the Transformer schedule)."""

    def multiplier(self, step: int, epoch: int) -> float:
        warm = max(self.hp.warmup_steps, 1)
        return min((step + 1) / warm, math.sqrt(warm / (step + 1)))


@lr_schedules.register("cosine")
class Cosine(LRSchedule):
    """Warmup then cosine decay to 0 over ``hp.max_steps`` (or max_epochs × steps/epoch)."""

    def multiplier(self, step: int, epoch: int) -> float:
        total = self.hp.max_steps or (self.hp.max_epochs * (self.steps_per_epoch or 0))
        if total <= 0:
            return _warmup(self.hp, step)
        progress = min(1.0, step / total)
        return _warmup(self.hp, step) * 0.5 * (1 + math.cos(math.pi * progress))


@lr_schedules.register("epoch_decay")
class EpochDecay(LRSchedule):
    """Zaremba et al.: ``lr_decay ** max(epoch + 1 - lr_decay_start_epoch, 0)``."""

    def multiplier(self, step: int, epoch: int) -> float:
        return self.hp.lr_decay ** max(epoch + 1 - self.hp.lr_decay_start_epoch, 0)


@lr_schedules.register("plateau")
class Plateau(LRSchedule):
    """Multiply by ``lr_decay`` whenever the validation loss does not improve."""

    def __init__(self, hp: HParams, steps_per_epoch: int | None = None) -> None:
        super().__init__(hp, steps_per_epoch)
        self.scale = 1.0
        self.best = math.inf

    def multiplier(self, step: int, epoch: int) -> float:
        return self.scale

    def on_eval(self, metric: float) -> None:
        if metric < self.best:
            self.best = metric
        else:
            self.scale *= self.hp.lr_decay

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.best = float(state["scale"]), float(state["best"])


def build_schedule(hp: HParams, steps_per_epoch: int | None = None) -> LRSchedule:
    return lr_schedules.get(hp.lr_schedule)(hp, steps_per_epoch)
