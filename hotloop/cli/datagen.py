"""``hotloop datagen``: prepare a problem's data (``problem.prepare()``)."""
from __future__ import annotations

import argparse

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "datagen"
HELP = "prepare a problem's data (download, verify, encode, write shards)"
RUN_FLAGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the run flags (``--problem``, ``--data-dir``, ``--raw-dir``, ``--raw-root``)."""


def run(args: argparse.Namespace) -> int:
    from ..registry import problems
    from .common import stops_at_once
    problem = problems.get(args.problem)(data_dir=args.data_dir, raw_dir=args.raw_dir)
    with stops_at_once():            # a stop signal ends datagen at once (exit 128 + signal)
        problem.prepare()
    where = problem.data_dir or "(generated on the fly; nothing to write)"
    print(f"prepared {args.problem} in {where}")
    return 0
