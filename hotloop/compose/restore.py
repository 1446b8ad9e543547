"""Reload a trained run from a checkpoint: problem, hparams and model with its weights.

One way for ``eval``, ``decode`` and ``export`` to get a trained model back
without the optimizer or reader state; :func:`evaluate_checkpoint` scores it on its splits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..hparams import HParams, HParamsError, hparams_from_dict
from ..problems.base import Problem, ProblemSpec
from ..registry import models
from ..train.checkpoint import CheckpointError, CheckpointManager, load_checkpoint, verify_checkpoint
from ..train.evaluation import evaluate_reader
from .build import build_recorded_model, problem_class
from .run_data import recorded_data, using_roots

__all__ = ["TrainedRun", "find_checkpoint", "load_trained", "evaluate_checkpoint"]


@dataclass
class TrainedRun:
    """A model rebuilt from a checkpoint, in eval mode, with what made it."""

    problem: Problem
    hp: HParams
    spec: ProblemSpec
    model: nn.Module
    checkpoint: Path
    run_info: dict[str, Any] = field(default_factory=dict)   # names, overrides, data dirs
    precision: str = "fp32"                                   # the run's strategy precision


def find_checkpoint(output_dir: str | Path | None = None, checkpoint: str | Path | None = None, *,
                    which: str = "best") -> Path:
    """``checkpoint`` itself, or the best (else latest) checkpoint of run ``output_dir`` that verifies.

    A damaged best or latest is moved aside with a notice on stderr, and the newest one
    that verifies is used; ``checkpoint`` itself is never replaced (loading it raises).
    """
    if bool(output_dir) == bool(checkpoint):
        raise CheckpointError("give exactly one of --output-dir or --checkpoint")
    if checkpoint:
        verify_checkpoint(checkpoint)   # a damaged named file is an error, never a fallback
        return Path(checkpoint)
    manager = CheckpointManager(Path(output_dir) / "checkpoints")  # type: ignore[arg-type]
    path = manager.verified(which)
    if path is None:
        raise CheckpointError(f"no checkpoint in {Path(output_dir) / 'checkpoints'}")  # type: ignore[arg-type]
    return path


def load_trained(path: str | Path, *, device: str | torch.device = "cpu", data_dir: str | None = None,
                 raw_dir: str | None = None, prepare: bool = True, raw_root: str | None = None) -> TrainedRun:
    """Rebuild the run recorded in checkpoint ``path`` (problem, hparams, model + weights).

    The data comes from the run's recorded data directory, raw directory and roots unless
    ``data_dir``, ``raw_dir`` or ``raw_root`` say otherwise (:mod:`hotloop.compose.run_data`);
    prepared data that matches its manifest is used as it is (no raw file is read).

    Raises :class:`CheckpointError` naming the file when it is unreadable, was not
    written by ``hotloop train``, or does not fit the recorded model; an unknown
    problem/model name raises the registry's error (pass ``--import``), and so does an
    hparams class that no registered component or ``--import`` module defines.
    """
    path = Path(path)
    payload = load_checkpoint(path)
    meta = payload["meta"]
    run = _run_record(path, meta)
    if "hparams" not in meta or not isinstance(payload.get("model"), dict):
        raise CheckpointError(f"checkpoint {path} does not record its problem/model/hparams; "
                              f"it was not written by `hotloop train`")
    model_cls = models.get(run["model"])          # registry names first: they define the hparams class
    problem_cls = problem_class(run["problem"], model_cls)
    try:
        hp = hparams_from_dict(meta["hparams"])   # never imports a module the checkpoint names
    except HParamsError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from None
    data = recorded_data(run, data_dir=data_dir, raw_dir=raw_dir, raw_root=raw_root)
    with using_roots(data):             # problems read the roots when they are built
        problem = problem_cls(data_dir=data.data_dir, raw_dir=data.raw_dir)
        if prepare:
            problem.prepare()
    spec = problem.spec(hp)
    device = torch.device(device)
    model = build_recorded_model(model_cls, hp, spec, device, f"checkpoint {path}")
    try:
        model.load_state_dict(payload["model"])
    except (RuntimeError, TypeError, AttributeError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"checkpoint {path} does not fit model {run['model']!r}: {detail}") from None
    model.eval()
    strategy = meta.get("strategy") if isinstance(meta.get("strategy"), dict) else {}
    precision = strategy.get("precision", "fp32") if strategy.get("precision") in ("fp32", "bf16", "fp16") else "fp32"
    if precision == "fp16" and device.type != "cuda":
        precision = "fp32"
    return TrainedRun(problem, hp, spec, model, path, dict(run), precision)


def _run_record(path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta["run"]`` with its names and data directories checked to be text."""
    run = meta.get("run") or {}
    if not isinstance(run, dict) or not isinstance(run.get("problem"), str) or not run["problem"] \
            or not isinstance(run.get("model"), str) or not run["model"]:
        raise CheckpointError(f"checkpoint {path} does not record its problem/model/hparams; "
                              f"it was not written by `hotloop train`")
    for key in ("data_dir", "raw_dir"):
        if run.get(key) is not None and not isinstance(run[key], str):
            raise CheckpointError(f"checkpoint {path} records {key} {run[key]!r}, not a path")
    return run


def evaluate_checkpoint(path: str | Path, splits: Sequence[str] = ("valid", "test"), *,
                        device: str | torch.device = "cpu", data_dir: str | None = None,
                        raw_dir: str | None = None, max_batches: int = 0, raw_root: str | None = None
                        ) -> dict[str, dict[str, float] | str]:
    """Rebuild the run recorded in checkpoint ``path`` and evaluate each split.

    Returns ``split -> metrics``, or ``split -> reason`` for a split the problem lacks.
    """
    trained = load_trained(path, device=device, data_dir=data_dir, raw_dir=raw_dir, raw_root=raw_root)
    problem, hp, spec, model, precision = (trained.problem, trained.hp, trained.spec, trained.model,
                                           trained.precision)
    device = torch.device(device)
    results: dict[str, dict[str, float] | str] = {}
    for split in splits:
        try:
            reader = problem.reader(split, hp, shuffle=False)
        except (ValueError, FileNotFoundError, KeyError) as exc:
            results[split] = f"not available ({exc})"
            continue
        state = model.initial_state(hp.batch_size, device) if spec.streamed else None
        results[split] = evaluate_reader(model, reader, device=device, precision=precision,
                                         initial_state=state, max_batches=max_batches)
    return results
