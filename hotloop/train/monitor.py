"""The monitored metric: which evaluation value picks the best checkpoint and drives early stopping.

A :class:`Monitor` is a metric name (``loss``, ``accuracy``, a user metric such as ``f1``, or
``bleu`` with ``--eval-bleu``) and a mode (``min``: lower is better, ``max``: higher is better).
A name that the evaluation does not produce is a :class:`MonitorError` naming the metrics that
exist; :func:`check_metric` runs at the start of ``fit()`` (from a one-batch evaluation when the
split has not been evaluated yet, see :meth:`hotloop.train.trainer.Trainer.metric_names`) and at
every evaluation.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable

import torch

from ..errors import UserError

__all__ = ["Monitor", "MonitorError", "is_better", "check_mode", "check_metric", "metric_names", "keep_comparable_best",
           "DEFAULT_MONITOR"]

DEFAULT_MONITOR = "loss"


class MonitorError(UserError, ValueError):
    """A monitored metric that the evaluation does not produce, or a bad mode."""


def check_mode(mode: str, who: str = "mode") -> str:
    """``mode`` if it is ``min`` or ``max``, else a :class:`MonitorError`."""
    if mode not in ("min", "max"):
        raise MonitorError(f"{who} must be 'min' or 'max', got {mode!r}")
    return mode


def is_better(value: float, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """``value`` improves on ``best`` (None: nothing yet) by more than ``min_delta`` in ``mode``."""
    if not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value < best - min_delta if mode == "min" else value > best + min_delta


def check_metric(name: str, names: Iterable[str], split: str, who: str = "--monitor") -> None:
    """A one-line :class:`MonitorError` unless the evaluation of ``split`` produces ``name``."""
    names = sorted(set(names))
    if name not in names:
        known = ", ".join(names) if names else "(none)"
        raise MonitorError(f"{who} {name!r}: the evaluation of {split!r} has no such metric; it has: {known}")


def metric_names(last_metrics: dict[str, dict[str, float]], split: str,
                 evaluate: Callable[..., dict[str, float]], device: torch.device,
                 callbacks: Iterable[object] = ()) -> list[str]:
    """The metrics ``split`` reports: from its last evaluation, else from ``evaluate(split,
    max_batches=1)`` run with the random generators left as they were; plus the names callbacks
    add at ``EVAL_END`` (their ``adds_metrics``, e.g. ``bleu``)."""
    if split in last_metrics:
        names = set(last_metrics[split])
    else:
        devices: list[Any] = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            names = set(evaluate(split, max_batches=1))
    for callback in callbacks:
        names.update(getattr(callback, "adds_metrics", ()))
    return sorted(names)


class Monitor:
    """``name`` in ``mode`` (default ``loss``, ``min``); ``explicit``: the user named it (checked)."""

    def __init__(self, name: str | None = None, mode: str = "min") -> None:
        self.explicit = name is not None
        self.name = name if name is not None else DEFAULT_MONITOR
        self.mode = check_mode(mode, "monitor mode")
        if not isinstance(self.name, str) or not self.name:
            raise MonitorError(f"monitor must be a metric name, got {name!r}")

    def score(self, value: float | None) -> float | None:
        """``value`` as a loss (lower is better): itself for ``min``, negated for ``max``; None if not finite."""
        if value is None or not math.isfinite(value):
            return None
        return float(value) if self.mode == "min" else -float(value)

    def best_record(self, metrics: dict[str, float]) -> dict[str, Any]:
        """``CheckpointManager.save`` arguments for an evaluation's ``metrics`` (empty: none): the
        score and what ``best.json`` records besides the step (the monitor, its mode and value)."""
        score = self.score(metrics.get(self.name))
        if score is None:
            return {"valid_loss": None}
        return {"valid_loss": score, "best_info": {"monitor": self.name, "mode": self.mode,
                                                   "value": float(metrics[self.name])}}

    def check_start(self, trainer: Any) -> None:
        """A named monitor must be a metric of ``trainer``'s first evaluation split (:class:`MonitorError`)."""
        if not self.explicit:
            return
        splits = tuple(trainer.eval_splits)
        split = splits[0] if splits else "(no evaluation split)"
        check_metric(self.name, trainer.metric_names(split) if splits else (), split)


def keep_comparable_best(manager: Any, monitor: Monitor, notify: Callable[[str], None]) -> None:
    """Forget ``manager``'s best (from ``best.json``) when another monitor or mode chose it."""
    record = manager.directory / "best.json" if manager is not None else None
    if record is None or not record.is_file() or manager.best_step is None:
        return
    try:
        info = json.loads(record.read_text())
    except ValueError:
        return
    chosen = (info.get("monitor", DEFAULT_MONITOR), info.get("mode", "min"))
    if chosen != (monitor.name, monitor.mode):
        notify(f"best checkpoint: step {manager.best_step} was chosen by {chosen[0]} ({chosen[1]}); this run "
               f"monitors {monitor.name} ({monitor.mode}), so its best starts afresh")
        manager.best_step, manager.best_loss = None, math.inf
