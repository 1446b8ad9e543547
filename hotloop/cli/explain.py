"""``hotloop explain``: what a strategy does to a run's model, without training it."""
from __future__ import annotations

import argparse

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "explain"
HELP = "show the effective strategy, device flags, graph passes, captures, fallbacks and memory of one step"
RUN_FLAGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="default",
                        help="default | auto (run the autotuner first) | a JSON file of Strategy fields")


def run(args: argparse.Namespace) -> int:
    from ..engine.explain import explain
    from ..compose.plan import StrategyRequest, plan_strategy
    from .common import build_from_args
    request = StrategyRequest.parse(args.strategy, args.strategy_override, args.device)
    built = build_from_args(args)
    strategy = plan_strategy(request, model=built.model, problem=built.problem, hp=built.hp,
                             device=args.device, log=lambda line: None)
    reader = built.problem.reader("train", built.hp)
    try:
        batch = next(iter(reader))
    finally:
        close = getattr(reader, "close", None)
        if callable(close):
            close()
    print(f"hotloop explain: {args.problem} / {args.model} / {built.info['hparams_set']}")
    explain(built.model, built.hp, strategy, batch, args.device)
    return 0
