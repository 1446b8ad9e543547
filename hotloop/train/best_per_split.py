"""Keep the best checkpoint of every evaluation split (each problem of a multi-problem run).

The Trainer's ``best.json`` follows the first eval split. :class:`BestPerSplit` watches
every ``EVAL_END`` of its splits and, when a split's monitored metric (default ``loss``, lower is
better; ``mode="max"``: higher is better) improves, keeps that step's
checkpoint as ``checkpoints/best-<name>.ckpt`` (a hard link, else a copy) where
``<name>`` is the split without its ``valid/`` prefix; ``best-mean.ckpt`` is the step
with the best mean of the metric over all the splits (one evaluation round). These names do
not match the ``step-*.ckpt`` files the CheckpointManager prunes, so they stay. Each gets
the manifest of its step (``best-<name>.manifest.json``), so it verifies like one.
``checkpoints/best_per_split.json`` records ``{name: {"split", "step", "monitor", "value", "file"}}``
(and ``"loss"``, the value, when the monitor is ``loss``).
The records are callback state, so a resumed run keeps comparing against them.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .events import Callback, Event
from .manifest import manifest_path
from .monitor import check_metric, check_mode, is_better

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

__all__ = ["BestPerSplit", "best_checkpoint_for", "RECORD_FILE", "MEAN"]

RECORD_FILE = "best_per_split.json"
MEAN = "mean"


def _short(split: str) -> str:
    """``valid/ptb_lm`` -> ``ptb_lm`` (the name in files and records)."""
    return split.split("/", 1)[1] if "/" in split else split


def best_checkpoint_for(output_dir: str | Path, name: str) -> Path | None:
    """The kept best checkpoint of problem (or split) ``name``, or ``"mean"``, in run ``output_dir``."""
    record = Path(output_dir) / "checkpoints" / RECORD_FILE
    if not record.is_file():
        return None
    entry = json.loads(record.read_text()).get(_short(name))
    path = record.parent / entry["file"] if entry else None
    return path if path is not None and path.is_file() else None


class BestPerSplit(Callback):
    """See the module doc; ``monitor`` in ``mode`` (``None``: ``loss``, not checked; a name given is
    checked at the start of ``fit()`` like ``--monitor``)."""

    def __init__(self, splits: Sequence[str], monitor: str | None = None, mode: str = "min") -> None:
        self.splits = tuple(splits)
        self.explicit, self.monitor = monitor is not None, monitor or "loss"
        self.mode = check_mode(mode, "BestPerSplit mode")
        self.best: dict[str, dict[str, Any]] = {}   # name -> {"split", "step", "monitor", "value", "file"}
        self._round: dict[str, float] = {}
        self._round_step = -1
        self._linked: dict[str, int] = {}          # name -> step its best-<name>.ckpt holds (this process)

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START and self.explicit:
            for split in self.splits:
                check_metric(self.monitor, trainer.metric_names(split), split)
        elif event is Event.EVAL_END and info.get("split") in self.splits:
            self._on_eval(trainer, info["split"], info["metrics"])
        elif event is Event.CHECKPOINT and info.get("path") is not None:
            self._keep(trainer, Path(info["path"]))

    def _on_eval(self, trainer: "Trainer", split: str, metrics: dict[str, float]) -> None:
        value = metrics.get(self.monitor)
        if value is None or not math.isfinite(value):
            return
        if self._round_step != trainer.step:
            self._round, self._round_step = {}, trainer.step
        self._round[split] = float(value)
        self._consider(_short(split), split, float(value), trainer.step)
        if len(self._round) == len(self.splits):
            mean = sum(self._round.values()) / len(self._round)
            self._consider(MEAN, ",".join(self.splits), mean, trainer.step)
        manager = trainer.checkpoints
        if manager is not None and manager.path_for(trainer.step).is_file():
            self._keep(trainer, manager.path_for(trainer.step))   # this step was saved already

    def _consider(self, name: str, split: str, value: float, step: int) -> None:
        old = self.best.get(name)
        if old is None or is_better(value, old.get("value", old.get("loss")), self.mode):
            entry = {"split": split, "step": step, "monitor": self.monitor, "value": value, "file": f"best-{name}.ckpt"}
            self.best[name] = {**entry, "loss": value} if self.monitor == "loss" else entry

    def _keep(self, trainer: "Trainer", path: Path) -> None:
        """Link ``path`` (the checkpoint of ``trainer.step``) as the best of every name it is best for."""
        if not trainer.dist.is_main:
            return
        changed = False
        for name, entry in self.best.items():
            if entry["step"] != trainer.step or self._linked.get(name) == trainer.step:
                continue
            target = path.parent / entry["file"]
            tmp = path.parent / f".tmp-best-{name}-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            try:
                os.link(path, tmp)
            except OSError:
                shutil.copy2(path, tmp)
            manifest_path(target).unlink(missing_ok=True)   # it would describe the old bytes
            os.replace(tmp, target)
            if manifest_path(path).is_file():               # the same bytes: the same manifest, written after
                shutil.copyfile(manifest_path(path), tmp)
                os.replace(tmp, manifest_path(target))
            self._linked[name] = trainer.step
            changed = True
        if changed:
            record = path.parent / RECORD_FILE
            tmp = path.parent / f".tmp-{RECORD_FILE}-{os.getpid()}"
            tmp.write_text(json.dumps(self.best, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, record)

    def state_dict(self) -> dict[str, Any]:
        return {"best": {k: dict(v) for k, v in self.best.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = {k: dict(v) for k, v in state.get("best", {}).items()}
