"""The complete training state as checkpoint contents, and its exact restoration.

``meta`` (JSON): step, epoch, hparams, strategy, schedule and callback state,
python RNG, GradScaler state, run info. ``tensors`` (tensors / plain data):
model and optimizer state, torch/CUDA/numpy RNG, reader position, carried
model state.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..class_lookup import resolve_hparams_class
from ..hparams import HParamsError, hparams_to_dict
from .checkpoint import CheckpointError, decode_plain, encode_plain, load_checkpoint
from .feeding import to_device

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

__all__ = ["training_state", "restore_training_state", "seed_everything", "hparams_differences"]

_RUN_LIMITS = ("max_steps", "max_epochs")  # may change on resume without a notice
_GROUP_EXECUTION_KEYS = ("foreach", "fused", "capturable", "differentiable")


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def training_state(trainer: "Trainer", valid_loss: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, tensors)`` for :func:`hotloop.train.checkpoint.save_checkpoint`."""
    version, internal, gauss = random.getstate()
    meta = {
        "step": trainer.step, "epoch": trainer.epoch,
        "hparams": hparams_to_dict(trainer.hp), "strategy": trainer.strategy.to_dict(),
        "schedule": trainer.schedule.state_dict(), "callbacks": trainer.callbacks.state_dict(),
        "python_rng": [version, list(internal), gauss],
        "precision": trainer.precision.state_dict(),
        "run": trainer.run_info, "valid_loss": valid_loss, "metrics": trainer.last_metrics,
        "torch": torch.__version__, "evaluated": trainer._last_eval_step == trainer.step,
    }
    rng: dict[str, Any] = {"torch": torch.get_rng_state(),
                           "numpy": encode_plain(list(np.random.get_state()))}
    if torch.cuda.is_available() and trainer.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state_all()
    position = trainer.feeder.position() if trainer.feeder.consumed else None
    tensors = {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.dist.consolidate_optimizer_state(trainer.optimizer),
        "rng": rng, "reader": encode_plain(position), "state": trainer.state,
    }
    return meta, tensors


def hparams_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: saved -> current`` for every differing field except run limits."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key in _RUN_LIMITS or key == "__class__":
            continue
        a, b = saved.get(key), current.get(key)
        if (list(a) if isinstance(a, (list, tuple)) else a) != (list(b) if isinstance(b, (list, tuple)) else b):
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def _check_hparams_class(saved: Any, trainer: "Trainer", path: Path) -> None:
    """The saved hparams name a class hotloop knows (resolved without importing what they name)."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} has hparams that are not a mapping")
    qual = saved.get("__class__")
    if qual and qual != hparams_to_dict(trainer.hp)["__class__"]:
        try:
            resolve_hparams_class(qual)
        except HParamsError as exc:
            raise CheckpointError(f"checkpoint {path}: {exc}") from None


def _require(payload: dict[str, Any], path: Path, *keys: str) -> None:
    for key in keys:
        if key not in payload:
            raise CheckpointError(f"checkpoint {path} is incomplete: no {key!r} entry")


def restore_training_state(trainer: "Trainer", path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """Load ``path`` into ``trainer``; returns (reader position or None, changed hparams)."""
    payload = load_checkpoint(path, map_location="cpu", notify=trainer.notify)
    _require(payload, path, "model", "optimizer", "rng", "reader", "state")
    meta = payload["meta"]
    for key in ("step", "epoch", "hparams", "schedule", "callbacks", "python_rng"):
        if key not in meta:
            raise CheckpointError(f"checkpoint {path} is incomplete: no {key!r} in its metadata")
    _check_hparams_class(meta["hparams"], trainer, path)
    try:
        trainer.model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])[:300]
        raise CheckpointError(f"checkpoint {path} does not fit this model: {detail}") from None
    execution = [{k: g[k] for k in _GROUP_EXECUTION_KEYS if k in g} for g in trainer.optimizer.param_groups]
    try:
        trainer.optimizer.load_state_dict(payload["optimizer"])
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} has optimizer state that does not fit: {exc}") from None
    for group, keys in zip(trainer.optimizer.param_groups, execution):
        group.update(keys)  # keep this run's kernel choice (strategy.fused_optimizer)
    try:
        trainer.schedule.load_state_dict(meta["schedule"])
        trainer.callbacks.load_state_dict(meta["callbacks"])
        # checkpoints before the Precision object kept the scaler's state as "grad_scaler"
        trainer.precision.load_state_dict(meta.get("precision") or {"scaler": meta.get("grad_scaler")})
        version, internal, gauss = meta["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        np.random.set_state(tuple(decode_plain(payload["rng"]["numpy"])))
        torch.set_rng_state(payload["rng"]["torch"])
        if "cuda" in payload["rng"] and torch.cuda.is_available() and trainer.device.type == "cuda":
            torch.cuda.set_rng_state_all(payload["rng"]["cuda"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} has unusable training state: {exc}") from None
    trainer.step, trainer.epoch = int(meta["step"]), int(meta["epoch"])
    if meta.get("evaluated"):   # evaluated at this step already: do not evaluate it again
        trainer._last_eval_step = trainer.step
    trainer.last_metrics = dict(meta.get("metrics") or {})
    trainer.state = to_device(payload["state"], trainer.device)
    position = decode_plain(payload["reader"])
    return position, hparams_differences(meta["hparams"], hparams_to_dict(trainer.hp))
