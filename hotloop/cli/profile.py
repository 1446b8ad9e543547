"""``hotloop profile``: the speed doctor on a run's real training step."""
from __future__ import annotations

import argparse

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "profile"
HELP = ("where the step time goes (data wait / forward / backward / optimizer / sync), queue health, "
        "top ops, syncs, memory, MFU and what to change")
RUN_FLAGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after warm-up)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profiled-steps", type=int, default=5, help="steps under torch.profiler")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--html", default=None, metavar="FILE", help="write a self-contained HTML summary")
    out.add_argument("--png", default=None, metavar="FILE", help="write a PNG chart (needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    from ..engine.strategy import Strategy
    from ..tools.profile import profile_training
    from .common import CLIError, build_from_args
    if args.steps < 1 or args.warmup < 0 or args.profiled_steps < 1:
        raise CLIError("--steps and --profiled-steps must be >= 1 and --warmup >= 0")
    strategy = Strategy.parse(args.strategy_override).validate(args.device)
    built = build_from_args(args)
    report = profile_training(built.model, built.problem, built.hp, strategy, args.device,
                              steps=args.steps, warmup=args.warmup, profiled_steps=args.profiled_steps)
    print(report.text())
    if args.html:
        print(f"\nwrote {report.write_html(args.html)}")
    if args.png:
        print(f"\nwrote {report.write_png(args.png)}")
    return 0
