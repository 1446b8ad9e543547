"""``hotloop train``'s monitor flags: ``--monitor NAME --mode min|max`` choose the best checkpoint,
``--early-stop PATIENCE`` (with ``--early-stop-min-delta``) stops a run whose monitored metric
stopped improving. The same settings are config-file keys (``monitor``, ``mode``, ``early_stop``,
``early_stop_min_delta``) and are recorded in ``run.json``.
"""
from __future__ import annotations

import argparse
import math
from typing import Any

from .common import CLIError

__all__ = ["add_monitor_flags", "check_monitor_flags", "monitor_settings", "early_stopping"]


def add_monitor_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--monitor", default=None, metavar="NAME",
                        help="the evaluation metric of the first eval split that picks the best checkpoint "
                             "and drives --early-stop (default loss; an unknown name is an error listing them)")
    parser.add_argument("--mode", choices=("min", "max"), default=None,
                        help="min (default): lower --monitor is better; max: higher is better")
    parser.add_argument("--early-stop", type=int, default=None, metavar="PATIENCE",
                        help="stop after PATIENCE evaluations without improvement of --monitor (default 0: off)")
    parser.add_argument("--early-stop-min-delta", type=float, default=None, metavar="DELTA",
                        help="an improvement must exceed DELTA (default 0)")


def check_monitor_flags(args: argparse.Namespace) -> None:
    """One-line errors for a bad mode, patience or delta (flags or config file)."""
    if args.monitor is not None and (not isinstance(args.monitor, str) or not args.monitor):
        raise CLIError(f"--monitor needs a metric name, got {args.monitor!r}")
    if args.mode not in ("min", "max"):
        raise CLIError(f"--mode must be min or max, got {args.mode!r}")
    if args.early_stop < 0:
        raise CLIError(f"--early-stop must be >= 0 evaluations, got {args.early_stop}")
    if not (math.isfinite(args.early_stop_min_delta) and args.early_stop_min_delta >= 0):
        raise CLIError(f"--early-stop-min-delta must be >= 0, got {args.early_stop_min_delta:g}")


def monitor_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``run.json`` records of them (``--config run.json`` repeats them)."""
    return {"monitor": args.monitor, "mode": args.mode, "early_stop": args.early_stop,
            "early_stop_min_delta": args.early_stop_min_delta}


def early_stopping(args: argparse.Namespace) -> list[Any]:
    """``[EarlyStopping(...)]`` on the first evaluation split when ``--early-stop`` is set, else ``[]``."""
    if not args.early_stop:
        return []
    from ..train.events import EarlyStopping
    return [EarlyStopping(args.monitor or "loss", args.early_stop, args.early_stop_min_delta, args.mode)]
