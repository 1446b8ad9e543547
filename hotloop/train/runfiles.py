"""The files that describe a run: ``hparams.json`` and ``run.json`` in its output directory.

``run.json`` holds the run info the caller gave the Trainer (the ``hotloop train``
command records its names, overrides, limits and loggers there, in the format
``--config`` reads) plus the concrete Strategy, the device and the torch version;
``hotloop train --config D/run.json --output-dir D2`` repeats the run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..hparams import HParams, hparams_to_dict

__all__ = ["write_run_files", "read_run_info"]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def write_run_files(output_dir: Path, hp: HParams, run_info: dict[str, Any], strategy: Any,
                    device: torch.device) -> None:
    """Atomically write ``hparams.json`` and ``run.json`` under ``output_dir``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    run = {**run_info, "strategy": strategy.to_dict(), "device": str(device), "torch": torch.__version__}
    _write_json(output_dir / "hparams.json", hparams_to_dict(hp))
    _write_json(output_dir / "run.json", run)


def read_run_info(output_dir: Path) -> dict[str, Any] | None:
    """``run.json`` of ``output_dir`` as a dict, or None when it is missing or unreadable."""
    try:
        data = json.loads((Path(output_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
