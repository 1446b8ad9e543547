"""``hotloop profile``: the speed doctor on a registered (or --import'ed) problem/model."""
from __future__ import annotations

import argparse
import importlib.util
from typing import Sequence

from .cli_common import add_run_arguments, build_from_args, run_cli

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotloop profile", description=(
        "Where the step time goes (data wait / host overhead / forward / backward / optimizer / sync), "
        "queue health, top ops, syncs, memory, MFU and what to change."))
    add_run_arguments(parser)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after warm-up)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profiled-steps", type=int, default=5, help="steps under torch.profiler")
    parser.add_argument("--strategy-override", default=None, help='Strategy overrides "k=v,k=v"')
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--html", default=None, metavar="FILE", help="write a self-contained HTML summary")
    out.add_argument("--png", default=None, metavar="FILE", help="write a PNG chart (needs matplotlib)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from ..engine.strategy import parse_strategy
        from .profile import profile_training
        if args.steps < 1 or args.warmup < 0 or args.profiled_steps < 1:
            raise ValueError("--steps and --profiled-steps must be >= 1 and --warmup >= 0")
        if args.png and importlib.util.find_spec("matplotlib") is None:
            from ..cli import CLIError
            raise CLIError("--png needs matplotlib (pip install matplotlib); use --html instead")
        strategy = parse_strategy(None, args.strategy_override).validate(args.device)
        run = build_from_args(args)
        report = profile_training(run.model, run.problem, run.hp, strategy, args.device,
                                  steps=args.steps, warmup=args.warmup, profiled_steps=args.profiled_steps)
        print(report.text())
        if args.html:
            print(f"\nwrote {report.write_html(args.html)}")
        if args.png:
            print(f"\nwrote {report.write_png(args.png)}")
        return 0

    return run_cli(body)
