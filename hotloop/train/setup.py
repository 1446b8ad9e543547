"""The parts a :class:`~hotloop.train.trainer.Trainer` is built from, one named builder each.

- :func:`run_hparams`: the hparams with this run's limits, checked for an end.
- :func:`concrete_strategy`: the Strategy the run uses, checked against the device and
  the data-parallel context.
- :func:`open_train_reader`, :func:`steps_per_epoch`, :func:`reader_notices`: the (sharded) train
  reader (a DataLoader, dataset or HF dataset given as the reader is wrapped by
  :func:`hotloop.problems.datasets.reader_from_data`) and what it says at start.
- :func:`place_model`: the model on the device, with the Strategy's process-wide device
  flags (threads, backend switches) applied.
- :func:`build_training_step`: :func:`hotloop.engine.build_step` and what it reports.
- :func:`checkpoint_manager`: the run directory's checkpoints (None without one).

Each returns its part and, where there is something to tell, the notices for the user.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..engine import BuiltStep, Strategy, build_step
from ..engine.flags import apply_device_flags
from ..engine.step_parts import LossFn
from ..errors import UserError
from ..hparams import HParams
from ..problems.base import Problem, ProblemSpec, open_reader
from ..problems.datasets import reader_from_data
from .checkpoint import CheckpointManager
from .context import DistContext

__all__ = ["TrainerError", "run_hparams", "concrete_strategy", "open_train_reader", "steps_per_epoch",
           "reader_notices", "place_model", "build_training_step", "checkpoint_manager"]

_READER_PROTOCOL = ("state_dict", "load_state_dict", "set_epoch")


class TrainerError(UserError, ValueError):
    """A Trainer configuration that cannot run (e.g. no stopping criterion)."""


def run_hparams(hp: HParams, max_steps: int | None, max_epochs: int | None,
                max_time: float | None) -> HParams:
    """``hp`` with ``max_steps`` / ``max_epochs`` replaced where given; the run must have an end."""
    limits = {k: v for k, v in (("max_steps", max_steps), ("max_epochs", max_epochs)) if v is not None}
    hp = hp.replace(**limits) if limits else hp
    if not (hp.max_steps or hp.max_epochs or max_time):
        raise TrainerError("training has no end: set max_steps, max_epochs or max_time")
    if hp.accum_steps < 1:
        raise TrainerError(f"accum_steps must be >= 1, got {hp.accum_steps}")
    return hp


def concrete_strategy(strategy: Strategy | None, device: torch.device, dist: DistContext) -> Strategy:
    """``strategy`` (default ``Strategy()``), validated for ``device``; the context must run its mode."""
    if strategy is not None and not isinstance(strategy, Strategy):
        raise TrainerError(f"strategy must be a Strategy, got {type(strategy).__name__}; "
                           "tune one first with hotloop.compose.plan.auto_strategy(...)")
    strategy = strategy if strategy is not None else Strategy()
    strategy.validate(device)
    mode = getattr(dist, "mode", None)
    wanted = strategy.data_parallel
    if mode is not None and wanted != "none" and wanted != mode:
        raise TrainerError(f"strategy data_parallel={wanted!r} but the process-group context runs "
                           f"{mode!r}; build it with ProcessGroupContext.for_strategy(strategy)")
    return strategy


def open_train_reader(problem: Problem, hp: HParams, spec: ProblemSpec, strategy: Strategy,
                      dist: DistContext, reader: Any = None) -> Any:
    """``reader``, else the problem's train reader (``strategy.num_workers``), sharded by ``dist``.

    Streamed LM data is contiguous, so its problem decides the order (no shuffle asked for).
    """
    if reader is None:
        reader = open_reader(problem, "train", hp, workers=strategy.num_workers,
                             shuffle=None if spec.streamed else True)
    elif not all(hasattr(reader, name) for name in _READER_PROTOCOL):
        reader = reader_from_data(reader, hp, spec=spec, workers=strategy.num_workers)
    return dist.shard_reader(reader)


def reader_notices(reader: Any) -> list[str]:
    """The ``notices`` of ``reader`` and of the readers it wraps (e.g. "replayed on resume")."""
    notes: list[str] = []
    while reader is not None:
        notes.extend(getattr(reader, "notices", None) or ())
        reader = getattr(reader, "reader", None) or getattr(reader, "upstream", None)
    return notes


def steps_per_epoch(reader: Any, accum_steps: int) -> int | None:
    """Optimizer steps in one epoch of ``reader`` (None when it has no length)."""
    try:
        batches = len(reader)
    except TypeError:
        return None
    return max(1, math.ceil(batches / max(1, accum_steps)))


def place_model(model: nn.Module, strategy: Strategy, device: torch.device) -> tuple[nn.Module, list[str]]:
    """``model`` on ``device``, after the Strategy's process-wide device flags; returns the notices."""
    model = model.to(device)
    return model, [f"strategy: {note}" for note in apply_device_flags(strategy, device).notes]


def build_training_step(model: nn.Module, hp: HParams, strategy: Strategy, dist: DistContext,
                        loss_fn: LossFn | None = None) -> tuple[BuiltStep, list[str]]:
    """The run's step (optimizer, precision, data-parallel wrap, backend) and its notices."""
    built = build_step(model, hp, strategy, loss_fn=loss_fn, wrap=dist.wrap)
    notices = [f"strategy: {note}" for note in built.step.notices]
    if built.step.fallback_reason:
        notices.append(f"strategy backend={strategy.backend} fell back to eager: {built.step.fallback_reason}")
    return built, notices


def checkpoint_manager(output_dir: Path | None, keep_last: int, dist: DistContext) -> CheckpointManager | None:
    """``output_dir/checkpoints`` (the main rank writes), or None when the run has no directory."""
    if output_dir is None:
        return None
    return CheckpointManager(output_dir / "checkpoints", keep_last, writer=dist.is_main)
