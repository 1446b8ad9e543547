"""``hotloop tune``: run the autotuner explicitly and print candidate -> throughput -> parity -> chosen."""
from __future__ import annotations

import argparse
import json

from ..tools.tune_budget import COMPILE_MAX_SECONDS, DEFAULT_BUDGET_FRACTION, DEFAULT_MAX_SECONDS

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "tune"
HELP = ("choose the Strategy for strategy=auto: rule proposals confirmed by timed, interleaved trials "
        "against eager fp32 with a parity guard; the choice is cached")
RUN_FLAGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true", help="ignore and do not write the cache")
    parser.add_argument("--planned-steps", type=int, default=None,
                        help="steps of the run being tuned for (default: max_steps, else max_epochs x batches/epoch)")
    parser.add_argument("--budget-fraction", type=float, default=DEFAULT_BUDGET_FRACTION,
                        help="tuning budget as a fraction of the planned run's eager time")
    parser.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, help="hard cap on tuning time")
    parser.add_argument("--compile-max-seconds", type=float, default=COMPILE_MAX_SECONDS,
                        help="the cap when the planned run repays a compile (a compiling backend is proposed)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON")


def run(args: argparse.Namespace) -> int:
    from ..tools.autotune import tune
    from ..compose.plan import planned_steps
    from .common import build_from_args
    built = build_from_args(args)
    planned = args.planned_steps if args.planned_steps is not None else planned_steps(built.problem, built.hp)
    report = tune(built.model, built.problem, built.hp, args.device, planned,
                  budget_fraction=args.budget_fraction, max_seconds=args.max_seconds, compile_max_seconds=args.compile_max_seconds,
                  cache=not args.no_cache, log=lambda line: None)
    print(f"hotloop tune: {args.problem} / {args.model} / {built.info['hparams_set']}"
          f" (planned steps: {planned or 'unknown'})")
    print(report.summary())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"strategy": report.strategy.to_dict(), "rows": report.rows(),
                       "tune_seconds": report.tune_seconds, "cache": report.cache}, fh, indent=2, default=str)
    return 0
