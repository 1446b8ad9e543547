"""The Trainer's evaluations: :meth:`~TrainerEvaluation.evaluate` one split, all of them after a
step or an epoch, and the metric names a split reports (for monitors).

A mixin of :class:`~hotloop.train.trainer.Trainer`: it reads the Trainer's model, device, Strategy,
data-parallel context, stop control, evaluation settings (``loss_fn``, ``eval_step``, ``metrics``,
``eval_splits``, ``eval_batches``) and its ``_eval_reader(split)``.
"""
from __future__ import annotations

import time
from typing import Any

from .evaluation import EvaluationStopped, evaluate_reader
from .events import Event
from .monitor import metric_names

__all__ = ["TrainerEvaluation"]


class TrainerEvaluation:
    """``evaluate``, ``metric_names`` and the evaluation of every split (see the module doc)."""

    _metric_names: dict[str, list[str]]
    eval_stopped: bool

    def evaluate(self, split: str = "valid", max_batches: int | None = None,
                 interruptible: bool = False) -> dict[str, float]:
        """Metrics on ``split`` (see "Evaluation and metrics" in ``docs/trainer_api.md``); ``interruptible``:
        a stop signal ends it at the next batch (:class:`~hotloop.train.evaluation.EvaluationStopped`)."""
        reader, start = self._eval_reader(split)
        reader.load_state_dict(start)  # every evaluation sees the same batches
        limit = self.eval_batches if max_batches is None else max_batches
        stop = (lambda i: self.stopper.signalled(i % self.strategy.sync_every == 0)) if interruptible else None
        return evaluate_reader(self.model, reader, device=self.device, precision=self.strategy.precision,
                               initial_state=self._initial_state(), max_batches=limit,
                               reduce=self.dist.all_reduce_stats, loss_fn=self.loss_fn,
                               eval_step=self.eval_step, metrics=self.metrics, should_stop=stop)

    def metric_names(self, split: str) -> list[str]:
        """The names ``evaluate(split)`` reports (its last evaluation, else a one-batch evaluation)."""
        if split not in self._metric_names:
            self._metric_names[split] = metric_names(self.last_metrics, split, self.evaluate, self.device,
                                                     self.callbacks.callbacks)
        return self._metric_names[split]

    def _evaluate_all(self) -> None:
        start = time.perf_counter()
        for i, split in enumerate(self.eval_splits):
            try:
                metrics = self.evaluate(split, interruptible=True)
            except EvaluationStopped:
                self.eval_stopped = True
                return self.notify(f"{self.stopper.signal_name}: evaluation of {split} at step {self.step} stopped")
            self.last_metrics[split] = metrics
            if i == 0 and "loss" in metrics:
                self.schedule.on_eval(metrics["loss"])
            self.callbacks.emit(Event.EVAL_END, self, split=split, metrics=metrics)
        self.train_state.last_eval_step = self.step
        self._window.exclude(time.perf_counter() - start)   # training speed rows count training only
