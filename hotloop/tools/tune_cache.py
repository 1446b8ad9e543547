"""JSON cache of autotune choices.

Key: model class + hparams hash, input shapes, hardware fingerprint, device
and torch version. One file per key under :func:`hotloop.tools.hardware.cache_dir`
(``$HOTLOOP_CACHE_DIR`` or ``~/.cache/hotloop/autotune``). A file that cannot
be read or does not describe a valid Strategy is ignored with a warning.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..engine.strategy import Strategy
from ..hparams import HParams
from ..problems.base import Batch
from .hardware import HardwareInfo, cache_dir

__all__ = ["TuneCacheWarning", "cache_key", "cache_path", "load_choice", "save_choice"]

CACHE_VERSION = 1


class TuneCacheWarning(UserWarning):
    """A cache file was unreadable or invalid and has been ignored."""


def _hparams_hash(hp: HParams) -> str:
    text = json.dumps(hp.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shapes(batch: Batch) -> dict[str, list]:
    return {k: [list(v.shape), str(v.dtype)] for k, v in sorted(batch.items())
            if isinstance(v, torch.Tensor)}


def cache_key(model: nn.Module, hp: HParams, batch: Batch, hw: HardwareInfo,
              device: torch.device) -> dict[str, Any]:
    """Everything the choice depends on, as a JSON-able dict."""
    return {"version": CACHE_VERSION,
            "model": f"{type(model).__module__}.{type(model).__qualname__}",
            "hparams": _hparams_hash(hp), "inputs": _shapes(batch),
            "hardware": hw.fingerprint(), "device": device.type, "torch": torch.__version__}


def cache_path(key: dict[str, Any], directory: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return (directory or cache_dir()) / f"strategy_{digest}.json"


def _strategy_from(data: Any) -> Strategy:
    """The cached Strategy fields, each checked by name and type (:meth:`Strategy.from_mapping`)."""
    if not isinstance(data, dict):
        raise ValueError(f"the strategy is a {type(data).__name__}, not a mapping")
    return Strategy.from_mapping(data)


def load_choice(key: dict[str, Any], device: torch.device,
                directory: Path | None = None) -> tuple[Strategy, dict[str, Any]] | None:
    """The cached (strategy, record) for ``key``, or None (missing or corrupt: warned)."""
    path = cache_path(key, directory)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("key") != key:
            raise ValueError("key mismatch")
        strategy = _strategy_from(record["strategy"]).validate(device)
    except Exception as exc:  # any defect means: tune again
        warnings.warn(f"ignoring corrupt autotune cache file {path}: {type(exc).__name__}: {exc}",
                      TuneCacheWarning, stacklevel=2)
        return None
    return strategy, record


def save_choice(key: dict[str, Any], strategy: Strategy, table: list[dict[str, Any]],
                directory: Path | None = None) -> Path | None:
    """Write the choice atomically; returns the path (None if the cache dir is not writable)."""
    path = cache_path(key, directory)
    record = {"key": key, "strategy": strategy.to_dict(), "table": table}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=2, default=str)
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"cannot write autotune cache {path}: {exc}", TuneCacheWarning, stacklevel=2)
        return None
    return path
