"""Learning-rate schedules (registered in :data:`hotloop.registry.lr_schedules`) and the LR write.

A schedule is an object with ``multiplier(step, epoch) -> float`` (``step``: the 0-based index
of the optimizer step about to run), an optional ``on_eval(metric)`` hook (plateau decay) and
``state_dict``/``load_state_dict``. Every step, unless a callback claimed the LR
(:class:`LRControl`), each param group gets
``group["lr"] = hp.learning_rate * multiplier(step, epoch) * group.get("lr_scale", 1.0)``
(Python floats: no device sync).

Shapes, with ``W = hp.warmup_steps``, ``total = hp.max_steps`` (else ``max_epochs`` x steps per
epoch) and the floor ``f`` (:func:`lr_floor`: ``min_lr / learning_rate``, or ``min_lr_ratio``):

- warmup (every schedule but ``epoch_decay`` / ``plateau``): ``(step + 1) / W`` while ``step < W``;
- ``constant``: 1 after warmup;
- ``linear`` / ``cosine``: progress ``p = (step - W) / (total - W)`` in [0, 1] after warmup;
  ``f + (1 - f) * (1 - p)`` / ``f + (1 - f) * (1 + cos(pi p)) / 2`` (1 at the end of warmup,
  ``f`` from step ``total`` on); without a known ``total`` they stay at 1 after warmup;
- ``rsqrt_decay`` (alias ``inverse_sqrt``): ``max(f, min((step + 1) / W, sqrt(W / (step + 1))))``;
- ``epoch_decay``: ``max(f, lr_decay ** max(epoch + 1 - lr_decay_start_epoch, 0))``;
- ``plateau``: times ``lr_decay`` after each evaluation whose loss did not improve, never below ``f``.
"""
from __future__ import annotations

import math
from typing import Any

from .errors import UserError
from .hparams import HParams
from .registry import lr_schedules

__all__ = ["LRSchedule", "build_schedule", "lr_floor", "LRControl", "LRClaimError", "write_lr", "group_base_lr"]


def lr_floor(hp: HParams) -> float:
    """The decay floor as a multiplier of ``hp.learning_rate`` (``min_lr`` or ``min_lr_ratio``)."""
    min_lr, ratio = float(getattr(hp, "min_lr", 0.0)), float(getattr(hp, "min_lr_ratio", 0.0))
    if min_lr and ratio:
        raise UserError(f"set min_lr ({min_lr:g}) or min_lr_ratio ({ratio:g}), not both")
    if min_lr < 0 or ratio < 0:
        raise UserError(f"min_lr and min_lr_ratio must be >= 0, got {min_lr:g} and {ratio:g}")
    if min_lr:
        if hp.learning_rate <= 0 or min_lr > hp.learning_rate:
            raise UserError(f"min_lr={min_lr:g} must not exceed learning_rate={hp.learning_rate:g}")
        return min_lr / hp.learning_rate
    if ratio > 1:
        raise UserError(f"min_lr_ratio must be in [0, 1], got {ratio:g}")
    return ratio


class LRSchedule:
    """Base schedule: constant multiplier 1."""

    def __init__(self, hp: HParams, steps_per_epoch: int | None = None) -> None:
        self.hp = hp
        self.steps_per_epoch = steps_per_epoch
        self.floor = lr_floor(hp)

    @property
    def total_steps(self) -> int:
        """Planned optimizer steps (``max_steps``, else ``max_epochs`` x steps per epoch; 0: unknown)."""
        return self.hp.max_steps or (self.hp.max_epochs * (self.steps_per_epoch or 0))

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
    """Linear warmup, then 1."""

    def multiplier(self, step: int, epoch: int) -> float:
        return _warmup(self.hp, step)


class _WarmupDecay(LRSchedule):
    """Linear warmup, then ``floor + (1 - floor) * shape(progress)`` from warmup's end to ``total``."""

    def shape(self, progress: float) -> float:
        raise NotImplementedError

    def multiplier(self, step: int, epoch: int) -> float:
        warm, total = max(self.hp.warmup_steps, 0), self.total_steps
        if step < warm or total <= warm:
            return _warmup(self.hp, step)
        progress = min(1.0, (step - warm) / (total - warm))
        return self.floor + (1.0 - self.floor) * self.shape(progress)


@lr_schedules.register("linear")
class Linear(_WarmupDecay):
    """Linear warmup, then linear decay to the floor at ``total`` steps."""

    def shape(self, progress: float) -> float:
        return 1.0 - progress


@lr_schedules.register("cosine")
class Cosine(_WarmupDecay):
    """Linear warmup, then cosine decay to the floor at ``total`` steps (decay starts after warmup)."""

    def shape(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))


@lr_schedules.register("rsqrt_decay")
class RsqrtDecay(LRSchedule):
    """Linear warmup then 1/sqrt(step) decay (the Transformer schedule), never below the floor."""

    def multiplier(self, step: int, epoch: int) -> float:
        warm = max(self.hp.warmup_steps, 1)
        return max(self.floor, min((step + 1) / warm, math.sqrt(warm / (step + 1))))


@lr_schedules.register("inverse_sqrt")
class InverseSqrt(RsqrtDecay):
    """``rsqrt_decay`` under the name other libraries use (the same values)."""


@lr_schedules.register("epoch_decay")
class EpochDecay(LRSchedule):
    """Zaremba et al.: ``lr_decay ** max(epoch + 1 - lr_decay_start_epoch, 0)``, never below the floor."""

    def multiplier(self, step: int, epoch: int) -> float:
        return max(self.floor, self.hp.lr_decay ** max(epoch + 1 - self.hp.lr_decay_start_epoch, 0))


@lr_schedules.register("plateau")
class Plateau(LRSchedule):
    """Multiply by ``lr_decay`` whenever the validation loss does not improve (not below the floor)."""

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
            self.scale = max(self.floor, self.scale * self.hp.lr_decay)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.best = float(state["scale"]), float(state["best"])


def build_schedule(hp: HParams, steps_per_epoch: int | None = None) -> LRSchedule:
    """The schedule ``hp.lr_schedule`` names (a registered class), for a run of ``hp``."""
    return lr_schedules.get(hp.lr_schedule)(hp, steps_per_epoch)


def write_lr(param_groups: Any, lr: float) -> None:
    """``group["lr"] = lr * group.get("lr_scale", 1.0)`` for every param group."""
    for group in param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def group_base_lr(param_groups: Any) -> float:
    """The base LR the first param group runs at (its ``lr`` without its ``lr_scale``)."""
    for group in param_groups:
        scale = group.get("lr_scale", 1.0)
        return group["lr"] / scale if scale else group["lr"]
    return 0.0


class LRClaimError(UserError):
    """A second owner claimed the LR."""


class LRControl:
    """Who sets the LR each step: the schedule (default), or the one owner that :meth:`claim` ed it.

    :meth:`apply` writes the schedule's LR (times each group's ``lr_scale``) unless the LR is
    claimed; an owner writes ``group["lr"]`` itself (e.g. at ``Event.STEP_START``).
    """

    def __init__(self, schedule: LRSchedule, base_lr: float) -> None:
        self.schedule, self.base_lr = schedule, float(base_lr)
        self.owner: object | None = None
        self.last = self.base_lr

    def claim(self, owner: object) -> None:
        """Take the LR over from the schedule (one owner at a time)."""
        if self.owner is not None and self.owner is not owner:
            raise LRClaimError(f"the learning rate is already owned by {type(self.owner).__name__}; "
                               f"{type(owner).__name__} cannot claim it too")
        self.owner = owner

    def release(self, owner: object) -> None:
        """Give the LR back to the schedule (only its owner can)."""
        if self.owner is owner:
            self.owner = None

    def apply(self, param_groups: Any, step: int, epoch: int) -> float | None:
        """Write step ``step``'s LR (times each group's ``lr_scale``) unless claimed; return it (None if claimed)."""
        if self.owner is not None:
            return None
        self.last = self.base_lr * self.schedule.multiplier(step, epoch)
        write_lr(param_groups, self.last)
        return self.last

    def current(self, param_groups: Any) -> float:
        """The base LR the step runs at (for logs): the schedule's, or the owner's first group's."""
        return group_base_lr(param_groups) if self.owner is not None else self.last
