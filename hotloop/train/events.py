"""Training events and callbacks (composition, not subclassing the Trainer).

A callback receives every event through ``on_event(event, trainer, **info)``
and may keep state that is saved in checkpoints (``state_dict`` /
``load_state_dict``; plain JSON data only). Loggers are callbacks too.
"""
from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any, Iterable

from .monitor import MonitorError, check_metric, check_mode, is_better

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

__all__ = ["Event", "Callback", "CallbackList", "EarlyStopping"]


class Event(enum.Enum):
    """When callbacks are called; ``info`` keys are listed per event."""

    FIT_START = "fit_start"      # resumed: bool
    EPOCH_START = "epoch_start"  # epoch
    STEP_START = "step_start"    # step (about to run; the LR is written: an LR owner sets its own here)
    STEP_END = "step_end"        # step (no metrics: reading them would sync the device)
    LOG = "log"                  # row: dict of training metrics (every sync_every steps)
    EVAL_END = "eval_end"        # split, metrics: dict
    CHECKPOINT = "checkpoint"    # path
    FIT_END = "fit_end"          # result: FitResult
    INTERRUPT = "interrupt"      # step
    INFO = "info"                # message: a notice for the user (console)


class Callback:
    """Base class: override :meth:`on_event`; state must be JSON-serialisable."""

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        """Handle one event (default: ignore it)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @property
    def state_key(self) -> str:
        """Key of this callback's state inside a checkpoint."""
        return type(self).__name__


class CallbackList:
    """Dispatches events to callbacks in order; collects and restores their state."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks: list[Callback] = list(callbacks)

    def append(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def emit(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        for cb in self.callbacks:
            cb.on_event(event, trainer, **info)

    def _keys(self) -> list[str]:
        seen: dict[str, int] = {}
        keys = []
        for cb in self.callbacks:
            n = seen.get(cb.state_key, 0)
            seen[cb.state_key] = n + 1
            keys.append(cb.state_key if n == 0 else f"{cb.state_key}#{n}")
        return keys

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for key, cb in zip(self._keys(), self.callbacks):
            state = cb.state_dict()
            if state:
                out[key] = state
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, cb in zip(self._keys(), self.callbacks):
            if key in state:
                cb.load_state_dict(state[key])


class EarlyStopping(Callback):
    """Stop when ``monitor`` on ``split`` has not improved by ``min_delta`` for ``patience`` evals.

    ``split=None`` watches the Trainer's first evaluation split. A ``monitor`` the evaluation does
    not produce is a :class:`~hotloop.train.monitor.MonitorError` at the start of ``fit()``. The best
    value and the count of evaluations without improvement are checkpointed (callback state).
    """

    def __init__(self, monitor: str = "loss", patience: int = 3, min_delta: float = 0.0,
                 mode: str = "min", split: str | None = None) -> None:
        check_mode(mode, "EarlyStopping mode")
        if not isinstance(patience, int) or patience < 1:
            raise MonitorError(f"EarlyStopping patience must be an integer >= 1, got {patience!r}")
        if not min_delta >= 0:
            raise MonitorError(f"EarlyStopping min_delta must be >= 0, got {min_delta!r}")
        self.monitor, self.patience, self.min_delta = monitor, patience, float(min_delta)
        self.mode, self.split = mode, split
        self.best = math.inf if mode == "min" else -math.inf
        self.bad_evals = 0

    def _split(self, trainer: "Trainer") -> str:
        splits = tuple(trainer.eval_splits)
        split = self.split if self.split is not None else (splits[0] if splits else None)
        if split is None or split not in splits:
            raise MonitorError(f"EarlyStopping watches split {split!r}, which this run does not evaluate "
                               f"(its evaluation splits: {', '.join(splits) or 'none'})")
        return split

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START:
            split = self._split(trainer)
            check_metric(self.monitor, trainer.metric_names(split), split, "EarlyStopping monitor")
            return
        if event is not Event.EVAL_END or info.get("split") != self._split(trainer):
            return
        metrics = info["metrics"]
        check_metric(self.monitor, metrics, info["split"], "EarlyStopping monitor")
        value = float(metrics[self.monitor])
        if is_better(value, self.best, self.mode, self.min_delta):
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
            if self.bad_evals >= self.patience:
                trainer.request_stop(f"early stopping: {info['split']} {self.monitor} did not improve "
                                     f"for {self.patience} evaluations (best {self.best:.4f})")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_evals = float(state["best"]), int(state["bad_evals"])
