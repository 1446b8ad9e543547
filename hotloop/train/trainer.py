"""The Trainer: runs the compiled whole step, evaluates, logs, checkpoints, resumes.

The hot loop never reads a device value: step statistics are summed on the
device and read every ``strategy.sync_every`` steps (the log cadence). See
``docs/trainer_api.md`` for the constructor, ``fit()`` and ``evaluate()``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..engine import Strategy
from ..engine.process_settings import apply_process_settings
from ..engine.step_parts import LossFn
from ..hparams import HParams, hparams_to_dict
from ..problems.base import Problem
from ..problems.datasets import as_problem
from .checkpoint import CheckpointError
from .context import DistContext, LocalContext
from .events import Callback, CallbackList, Event
from .evaluation import EvalStep
from .feeding import DataFeeder
from .freeze import freeze_callbacks
from .init_from import InitWeights, init_model
from .interrupt import Interrupted, StopSignalGuard
from .loggers import default_loggers
from .metrics import bind_metrics
from .monitor import Monitor, keep_comparable_best
from .nonfinite import NonFiniteGuard
from .runfiles import write_run_files
from ..schedules import LRControl, build_schedule
from .setup import (TrainerError, build_training_step, checkpoint_manager, concrete_strategy, open_train_reader,
                    place_model, reader_notices, run_hparams, steps_per_epoch)
from .snapshot import checkpoint_contents, restore_components, sharded_contents
from .stateful import GlobalRNG, ModelState, OptimizerState, Stateful, seed_everything
from .stopping import StopControl
from .train_state import TrainState, TrainStateField
from .trainer_eval import TrainerEvaluation
from .window import LogWindow

__all__ = ["Trainer", "TrainerError", "FitResult"]

DATA_BOUND_FRACTION = 0.3


@dataclass
class FitResult:
    steps: int
    epochs: int                       # completed epochs
    wall_time: float                  # seconds spent in this fit() call
    stop_reason: str                  # "max_steps" | "max_epochs" | "max_time" | "stopped: ..."
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # split -> last eval
    last_checkpoint: str | None = None
    best_checkpoint: str | None = None
    nonfinite_steps: int = 0          # updates discarded under on_nonfinite="skip"


class Trainer(TrainerEvaluation):
    """Trains ``model`` on ``problem`` with ``hp``; see ``docs/trainer_api.md``.

    ``problem`` is a Problem, or data that :func:`~hotloop.problems.datasets.problem_from_data`
    takes (a DataLoader, a Dataset, an HF ``datasets.Dataset``, ...).

    ``max_steps`` / ``max_epochs`` replace ``hp.max_steps`` / ``hp.max_epochs``
    (so LR schedules see them too); ``max_time`` is in seconds of this ``fit()``.
    Evaluation runs every ``eval_every`` steps (0 = off), at each epoch end and
    at the end of training; a checkpoint is written after each evaluation,
    every ``checkpoint_every`` steps, at the end and on a stop signal (when
    ``output_dir`` is set). ``strategy`` is a concrete :class:`Strategy`
    (default ``Strategy()``); to tune one first, call
    :func:`hotloop.compose.plan.auto_strategy`; ``strategy.sync_every`` is the log
    cadence. ``on_nonfinite`` is ``"stop"`` or ``"skip"`` (:mod:`hotloop.train.nonfinite`).
    ``init_from`` copies weights from a checkpoint, run directory, safetensors export or Hugging
    Face BERT directory into ``model`` before training (:mod:`hotloop.train.init_from`; partial
    unless ``init_strict``; what loaded is in ``init_report``); the run still starts at step 0.
    The parts are built by :mod:`hotloop.train.setup`; a checkpoint holds the states of
    :meth:`components`.
    """

    def __init__(self, problem: Problem | Any, model: nn.Module, hp: HParams, *,
                 strategy: Strategy | None = None, device: str | torch.device = "cpu",
                 output_dir: str | Path | None = None, max_steps: int | None = None,
                 max_epochs: int | None = None, max_time: float | None = None,
                 eval_every: int = 0, eval_splits: Sequence[str] | None = None,
                 eval_batches: int = 0, checkpoint_every: int = 0, keep_last: int = 3,
                 callbacks: Sequence[Callback] = (), loggers: Sequence[Callback] | None = None,
                 dist: DistContext | None = None, loss_fn: LossFn | None = None,
                 train_reader: Any = None, eval_readers: dict[str, Any] | None = None,
                 run_info: dict[str, Any] | None = None, on_nonfinite: str = "stop",
                 init_from: str | Path | InitWeights | None = None, init_strict: bool = False,
                 eval_step: EvalStep | None = None, metrics: dict[str, Any] | None = None,
                 monitor: str | None = None, mode: str = "min", async_checkpoint: bool = False) -> None:
        self.hp = run_hparams(hp, max_steps, max_epochs, max_time)
        problem = as_problem(problem)   # a DataLoader, Dataset or HF dataset: problem_from_data
        self.problem, self.spec = problem, problem.spec(self.hp)
        self.device = torch.device(device)
        self.train_state = TrainState(self.device)
        self.dist: DistContext = dist if dist is not None else LocalContext()
        self.output_dir = Path(output_dir) if output_dir is not None else None
        splits = problem.eval_splits if eval_splits is None else eval_splits
        self.eval_every, self.eval_splits, self.eval_batches = eval_every, tuple(splits), eval_batches
        self.checkpoint_every = checkpoint_every
        self.run_info = dict(run_info or {})
        self.notices: list[str] = []
        main_loggers = default_loggers(self.output_dir) if loggers is None else list(loggers)
        self.callbacks = CallbackList(list(callbacks) + freeze_callbacks(self.hp)
                                      + (main_loggers if self.dist.is_main else []))

        self.strategy = concrete_strategy(strategy, self.device, self.dist)
        self.train_reader = open_train_reader(problem, self.hp, self.spec, self.strategy, self.dist,
                                              train_reader)
        self._eval_readers: dict[str, tuple[Any, Any]] = {
            split: (r, r.state_dict()) for split, r in (eval_readers or {}).items()}
        self.steps_per_epoch = steps_per_epoch(self.train_reader, self.hp.accum_steps)
        self.model, notices = place_model(model, self.strategy, self.device)
        notices = reader_notices(self.train_reader) + notices
        self.init_report = init_model(self.model, init_from, strict=init_strict, notify=self.notify) \
            if init_from is not None else None
        notices += self.init_report.lines() if self.init_report is not None else []
        built, step_notices = build_training_step(self.model, self.hp, self.strategy, self.dist, loss_fn)
        self.optimizer, self.precision, self.step_fn = built.optimizer, built.precision, built.step
        for note in notices + step_notices:
            self.notify(note)
        self.nonfinite = NonFiniteGuard(on_nonfinite, self.optimizer, self.device)
        self.schedule = build_schedule(self.hp, self.steps_per_epoch)
        self.lr_control = LRControl(self.schedule, self.hp.learning_rate)
        self.loss_fn, self.eval_step, self.monitor = loss_fn, eval_step, Monitor(monitor, mode)
        self.metrics = bind_metrics(metrics, self.device, self.dist.world_size, self.notify)
        self._metric_names: dict[str, list[str]] = {}
        self.eval_stopped = False   # a stop signal ended an evaluation
        self.feeder = DataFeeder(self.train_reader, self.device, self.strategy.prefetch,
                                 speed_test=self.strategy.speed_test)
        self.checkpoints = checkpoint_manager(self.output_dir, keep_last, self.dist)
        keep_comparable_best(self.checkpoints, self.monitor, self.notify)
        self.async_checkpoint = async_checkpoint   # sharded saves (several processes) overlap the next steps

        self.lr = self.hp.learning_rate
        self.last_checkpoint: Path | None = None
        self.stopper = StopControl(self.dist, max_time)
        self._in_step = False
        self._last_ckpt_step = -1
        self._warned_data_bound = False
        self._window = LogWindow()

    # ------------------------------------------------------------------ state
    step = TrainStateField("step")              # optimizer steps taken
    epoch = TrainStateField("epoch")            # current epoch (= completed epochs)
    state = TrainStateField("carried")          # carried model state (streamed LM problems), else None
    last_metrics = TrainStateField("metrics")   # split -> the metrics of its last evaluation

    @property
    def max_steps(self) -> int:
        return self.hp.max_steps

    @property
    def max_time(self) -> float | None:
        return self.stopper.max_time

    @property
    def host_syncs(self) -> int:
        """Device->host reads of training statistics so far (one per log row)."""
        return self._window.host_syncs

    def notify(self, message: str) -> None:
        """Record a notice and show it (console loggers print ``Event.INFO``)."""
        self.notices.append(message)
        if hasattr(self, "callbacks"):
            self.callbacks.emit(Event.INFO, self, message=message)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop after the current step (callbacks call this)."""
        self.stopper.request(reason)

    def components(self) -> dict[str, Stateful]:
        """What a checkpoint holds, by name: each saves and restores its own state (in this order)."""
        return {"model": ModelState(self.model), "optimizer": OptimizerState(self.optimizer, self.dist, self.model),
                "schedule": self.schedule, "callbacks": self.callbacks, "precision": self.precision,
                "reader": self.feeder, "train_state": self.train_state, "rng": GlobalRNG(self.device)}

    # -------------------------------------------------------------- training
    def fit(self, resume: bool | str | Path = False) -> FitResult:
        """Train until a limit is reached; ``resume=True`` continues from the latest
        checkpoint in ``output_dir`` (or from the given checkpoint path)."""
        process_lines = apply_process_settings()
        self.stopper.restart_clock()
        path = self._resume_path(resume) if resume else None
        position = self.load_checkpoint(path) if path is not None else None
        if path is None:
            seed_everything(self.hp.seed)
        self.monitor.check_start(self)   # an unknown name fails before anything is written
        if self.output_dir is not None and self.dist.is_main:
            write_run_files(self.output_dir, self.hp, self.run_info, self.strategy, self.device)
        self.callbacks.emit(Event.FIT_START, self, resumed=path is not None)
        for line in process_lines:
            self.notify(f"process: {line}")
        self._window.restart(self.feeder.data_time)
        try:
            with StopSignalGuard(self.stopper.on_signal):
                reason = self._loop(position)
                if reason == "interrupted":
                    raise Interrupted(self.stopper.signum or 2)
                self._finish(reason)
        except KeyboardInterrupt:
            self._on_interrupt()
            raise
        finally:
            self.feeder.close()
            self.model.train()
            if self.checkpoints is not None:
                self.checkpoints.wait()   # an asynchronous save completes before fit returns
        best = self.checkpoints.best() if self.checkpoints else None
        result = FitResult(self.step, self.epoch, time.monotonic() - self.stopper.start, reason,
                           dict(self.last_metrics), str(self.last_checkpoint) if self.last_checkpoint else None,
                           str(best) if best else None, self.nonfinite.skipped)
        self.callbacks.emit(Event.FIT_END, self, result=result)
        return result

    def _loop(self, position: dict[str, Any] | None) -> str:
        while True:
            reason = self._stop_reason(epoch_boundary=True)
            if reason:
                return reason
            self.feeder.start_epoch(self.epoch, position)
            fresh_epoch = position is None
            if fresh_epoch:
                self.state = self._initial_state()
                self.callbacks.emit(Event.EPOCH_START, self, epoch=self.epoch)
            position = None
            step_at_start = self.step
            while True:
                # an interrupt while a partial accumulation group is fetched leaves no consistent state
                self._in_step = self.hp.accum_steps > 1
                batches = self.feeder.next_step(self.hp.accum_steps)
                if batches is None:
                    self._in_step = False
                    break
                self._train_step(batches)
                self._after_step()
                reason = self._stop_reason()
                if reason:
                    return reason
            if fresh_epoch and self.step == step_at_start:
                raise TrainerError(f"the train reader yielded no batches in epoch {self.epoch}")
            self._end_epoch()

    def _initial_state(self) -> Any:
        if not self.spec.streamed:
            return None
        # data parallel: each rank reads batch_size // world_size rows (hotloop.parallel.sharding)
        return self.model.initial_state(self.hp.batch_size // self.dist.world_size, self.device)

    def _stop_reason(self, epoch_boundary: bool = False) -> str | None:
        return self.stopper.reason(step=self.step, epoch=self.epoch, max_steps=self.hp.max_steps,
                                   max_epochs=self.hp.max_epochs, epoch_boundary=epoch_boundary,
                                   sync_point=self.step % self.strategy.sync_every == 0)

    def _train_step(self, batches: list) -> None:
        self._in_step = True
        self.lr_control.apply(self.optimizer.param_groups, self.step, self.epoch)
        self.callbacks.emit(Event.STEP_START, self, step=self.step)
        self.lr = self.lr_control.current(self.optimizer.param_groups)
        result = self.step_fn(batches, self.state)
        self.state = result.state if self.spec.streamed else None
        self.step += 1
        bad = self.nonfinite.observe(self.step, result.loss, result.grad_norm)
        stats, loss, grad_norm = self.nonfinite.mask(bad, result.stats, result.loss, result.grad_norm)
        self._window.add_step(stats, loss, grad_norm, nonfinite=bad)
        self._in_step = False

    def _after_step(self) -> None:
        self.callbacks.emit(Event.STEP_END, self, step=self.step)
        if self.step % self.strategy.sync_every == 0:
            self._log()
        evaluated = bool(self.eval_every) and self.step % self.eval_every == 0
        if evaluated:
            self._evaluate_all()
        if evaluated or (self.checkpoint_every and self.step % self.checkpoint_every == 0):
            self.save_checkpoint()

    def _end_epoch(self) -> None:
        self.feeder.finish_epoch()
        self.epoch += 1
        if not self.train_state.evaluated:
            self._evaluate_all()
        if self._last_ckpt_step != self.step:
            self.save_checkpoint()

    def _finish(self, reason: str) -> None:
        if self._window.steps:
            self._log()
        if not reason.startswith("stopped") and not self.train_state.evaluated:
            self._evaluate_all()
        if self._last_ckpt_step != self.step:
            self.save_checkpoint()
        if self.eval_stopped:
            raise Interrupted(self.stopper.signum or 2)

    def _on_interrupt(self) -> None:
        self.callbacks.emit(Event.INTERRUPT, self, step=self.step)
        if self._in_step:
            self.notify(f"interrupted inside step {self.step + 1}; no checkpoint written for it")
            return
        if self._last_ckpt_step != self.step and self.checkpoints is not None:
            try:
                self.save_checkpoint()
            except Exception as exc:  # noqa: BLE001 - best effort while shutting down
                self.notify(f"could not save a checkpoint on interrupt: {exc}")

    # --------------------------------------------------------------- logging
    def _log(self) -> None:
        steps = self._window.steps
        row = self._window.read_row(step=self.step, epoch=self.epoch, lr=self.lr,
                                    data_time=self.feeder.data_time, world_size=self.dist.world_size,
                                    reduce=self.dist.all_reduce_stats,
                                    elapsed=time.monotonic() - self.stopper.start)
        self.nonfinite.check(int(row.get("nonfinite_steps", 0)), self.step - steps + 1, self.step)
        if row["data_fraction"] > DATA_BOUND_FRACTION and not self._warned_data_bound and self.step > steps:
            self._warned_data_bound = True
            self.notify(f"waiting for data {row['data_fraction']:.0%} of step time; add workers "
                        f"(strategy num_workers) or raise strategy prefetch")
        self.callbacks.emit(Event.LOG, self, row=row)

    # ------------------------------------------------------------ evaluation
    def _eval_reader(self, split: str) -> Any:
        if split not in self._eval_readers:
            reader = self.dist.shard_reader(self.problem.reader(split, self.hp, shuffle=False))
            self._eval_readers[split] = (reader, reader.state_dict())
        return self._eval_readers[split]

    # ----------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint of the complete training state (main rank; all ranks must call)."""
        if self.checkpoints is None:
            return None
        at_eval = self.train_state.evaluated and self.eval_splits
        last = self.last_metrics.get(self.eval_splits[0], {}) if at_eval else {}
        valid_loss = last.get("loss")
        description = {"step": self.step, "epoch": self.epoch, "hparams": hparams_to_dict(self.hp),
                       "strategy": self.strategy.to_dict(), "run": self.run_info, "valid_loss": valid_loss,
                       "torch": torch.__version__}
        path = None
        if self.dist.world_size > 1:   # every rank writes its shard (hotloop.train.dcp_checkpoint)
            parts = sharded_contents(self.components(), description)
            path = self.checkpoints.save_sharded(self.step, parts, self.components(), rank=self.dist.rank,
                                                 world_size=self.dist.world_size, asynchronous=self.async_checkpoint,
                                                 **self.monitor.best_record(last))
            if self.dist.is_main:
                self.last_checkpoint = path
                self.callbacks.emit(Event.CHECKPOINT, self, path=path)
            self._last_ckpt_step = self.step
            self.dist.barrier()
            return path
        meta, tensors = checkpoint_contents(self.components(), description)
        if self.dist.is_main:
            path = self.checkpoints.save(self.step, meta, tensors, **self.monitor.best_record(last))
            self.last_checkpoint = path
            self.callbacks.emit(Event.CHECKPOINT, self, path=path)
        self._last_ckpt_step = self.step
        self.dist.barrier()
        return path

    def _resume_path(self, resume: bool | str | Path) -> Path | None:
        """The checkpoint to resume from; None (a fresh start, with a notice) when there is none yet."""
        if isinstance(resume, (str, Path)):
            return Path(resume)
        if self.checkpoints is None:
            raise CheckpointError("resume needs an output_dir with checkpoints")
        path = self.checkpoints.newest_verified(self.notify)   # damaged ones are set aside
        if path is None:
            self.notify(f"resume: no checkpoint in {self.checkpoints.directory} yet; starting from step 0")
        return path

    def load_checkpoint(self, path: str | Path) -> dict[str, Any] | None:
        """Restore every component from ``path``; returns the reader position to continue the epoch from."""
        differences = restore_components(Path(path), self.components(), self.hp, self.notify)
        position = self.feeder.resume_position
        self._last_ckpt_step = self.step
        self.last_checkpoint = Path(path)
        if differences:
            self.notify(f"resuming {path} with changed hparams: {', '.join(differences)}")
        return position
