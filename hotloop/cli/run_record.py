"""What a ``hotloop train`` run records and prints: the settings ``run.json`` keeps
(:func:`run_info`, enough for ``--config run.json`` to repeat the run) and the end-of-run lines
(:func:`print_summary`).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .monitor_flags import monitor_settings

__all__ = ["run_info", "print_summary"]


def run_info(args: argparse.Namespace, hparams_name: str, out: Path) -> dict[str, Any]:
    """What ``run.json`` records besides the Strategy and device: enough for ``--config run.json``
    (the data paths absolute, with the raw and data roots in effect)."""
    from ..compose.run_data import record_data_paths
    return {"problem": args.problem, "model": args.model, "hparams_set": hparams_name,
            "overrides": dict(args.hparams_changes), **record_data_paths(args.data_dir, args.raw_dir),
            "imports": list(args.imports), "max_steps": args.max_steps, "max_epochs": args.max_epochs,
            "max_time": args.max_time, "eval_every": args.eval_every, "keep_last": args.keep_last,
            "loggers": args.loggers, "on_nonfinite": args.on_nonfinite, "eval_bleu": args.eval_bleu,
            "init_from": args.init_from, "init_strict": args.init_strict,
            "init_hparams_from_config": args.init_hparams_from_config, **monitor_settings(args),
            "output_dir": str(out)}


def print_summary(result: Any) -> None:
    """The end-of-run lines: steps, time, stop reason, last metrics, the last and best checkpoints."""
    print(f"done: {result.steps} steps, {result.epochs} epochs in {result.wall_time:.1f} s ({result.stop_reason})")
    for split, metrics in result.metrics.items():
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k not in ("tokens", "examples"))
        print(f"  {split}: {shown}")
    if getattr(result, "nonfinite_steps", 0):
        print(f"  skipped {result.nonfinite_steps} non-finite step(s) (--on-nonfinite skip)")
    if result.last_checkpoint:
        print(f"  last checkpoint: {result.last_checkpoint}")
    if result.best_checkpoint:
        print(f"  best checkpoint: {result.best_checkpoint}")
