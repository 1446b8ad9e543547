"""``hotloop tune``: run the autotuner explicitly and print candidate -> throughput -> parity -> chosen."""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from .cli_common import add_run_arguments, build_from_args, planned_steps, run_cli

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotloop tune", description=(
        "Choose the Strategy for strategy=auto: rule proposals confirmed by timed, interleaved trials "
        "against eager fp32 with a parity guard; the choice is cached."))
    add_run_arguments(parser)
    parser.add_argument("--no-cache", action="store_true", help="ignore and do not write the cache")
    parser.add_argument("--planned-steps", type=int, default=None,
                        help="steps of the run being tuned for (default: max_steps, else max_epochs x batches/epoch)")
    parser.add_argument("--budget-fraction", type=float, default=0.05,
                        help="tuning budget as a fraction of the planned run's eager time")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="hard cap on tuning time")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from .autotune import tune
        run = build_from_args(args)
        planned = args.planned_steps if args.planned_steps is not None else planned_steps(run.problem, run.hp)
        report = tune(run.model, run.problem, run.hp, args.device, planned,
                      budget_fraction=args.budget_fraction, max_seconds=args.max_seconds,
                      cache=not args.no_cache, log=lambda line: None)
        print(f"hotloop tune: {args.problem} / {args.model} / {run.info['hparams_set']}"
              f" (planned steps: {planned or 'unknown'})")
        print(report.summary())
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump({"strategy": report.strategy.to_dict(), "rows": report.rows(),
                           "tune_seconds": report.tune_seconds, "cache": report.cache}, fh, indent=2,
                          default=str)
        return 0

    return run_cli(body)
