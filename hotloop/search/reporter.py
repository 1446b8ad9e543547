"""The callback a trial's Trainer runs with: it reports each evaluation to the Optuna trial.

At every evaluation of the first eval split (``valid``) the callback reports the searched metric
to the trial (``trial.report(value, step)``) and asks the pruner; a trial to prune is stopped like
any requested stop (the Trainer writes its checkpoint and returns), so its directory is a normal
run. :meth:`TrialReporter.outcome` turns the finished run into the trial's state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..train.events import Callback, Event

if TYPE_CHECKING:  # pragma: no cover
    from ..train.trainer import Trainer

__all__ = ["TrialReporter", "TrialOutcome", "PRUNED_PREFIX"]

PRUNED_PREFIX = "pruned by the search"


@dataclass(frozen=True)
class TrialOutcome:
    """How a trial ended: ``state`` is ``complete``, ``pruned``, ``fail`` or ``interrupted``."""

    state: str
    value: float | None = None       # the metric at the last evaluation
    steps: int = 0
    message: str = ""                # why a trial failed or was pruned
    exit_code: int = 0               # the trial's ``hotloop train`` exit code


class TrialReporter(Callback):
    """Reports ``metric`` of the first eval split to ``trial`` and stops the run when it is pruned.

    ``pending_signal()`` returns a stop signal the search received before the Trainer installed
    its own handlers (None: none); the run then stops at its first step boundary.
    """

    def __init__(self, trial: Any, metric: str, *, prune: bool = True,
                 pending_signal: Callable[[], int | None] = lambda: None) -> None:
        self.trial, self.metric, self.prune = trial, metric, prune
        self.pending_signal = pending_signal
        self.value: float | None = None
        self.pruned: str | None = None
        self.missing: str | None = None
        self.result: Any = None

    @property
    def state_key(self) -> str:
        return "search_trial"

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START:
            signum = self.pending_signal()
            if signum is not None:
                trainer.stopper.on_signal(signum)
        elif event is Event.EVAL_END and trainer.eval_splits and info.get("split") == trainer.eval_splits[0]:
            self._evaluated(trainer, info["split"], info["metrics"])
        elif event is Event.FIT_END:
            self.result = info["result"]

    def _evaluated(self, trainer: "Trainer", split: str, metrics: dict[str, float]) -> None:
        if self.metric not in metrics:
            self.missing = (f"--metric {self.metric!r} is not a {split} metric; {split} metrics: "
                            f"{', '.join(sorted(metrics))}")
            trainer.request_stop(self.missing)
            return
        value, step = float(metrics[self.metric]), trainer.step
        self.value = value
        self.trial.report(value, step)
        last = bool(trainer.max_steps) and step >= trainer.max_steps
        if self.prune and self.pruned is None and not last and self.trial.should_prune():
            self.pruned = f"{PRUNED_PREFIX} at step {step} ({split} {self.metric}={value:.4g})"
            trainer.request_stop(self.pruned)

    def outcome(self, exit_code: int) -> TrialOutcome:
        """The trial's outcome after its run returned ``exit_code``."""
        steps = int(self.result.steps) if self.result is not None else 0
        if exit_code >= 128:
            return TrialOutcome("interrupted", self.value, steps, f"stopped by a signal (exit {exit_code})",
                                exit_code)
        if exit_code != 0 or self.result is None:
            return TrialOutcome("fail", self.value, steps, f"hotloop train exited with {exit_code}", exit_code)
        if self.pruned is not None and str(self.result.stop_reason).startswith("stopped"):
            return TrialOutcome("pruned", self.value, steps, self.pruned)
        if self.value is None:
            return TrialOutcome("fail", None, steps, f"no evaluation reported {self.metric!r}")
        if not math.isfinite(self.value):
            return TrialOutcome("fail", self.value, steps, f"{self.metric} is {self.value}")
        return TrialOutcome("complete", self.value, steps)
