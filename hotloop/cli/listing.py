"""``hotloop list``: every registered name, and the commands."""
from __future__ import annotations

import argparse

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "list"
HELP = "list every registered problem, model, hparams set, optimizer and schedule, and the commands"
RUN_FLAGS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags beyond ``--import``."""


def run(args: argparse.Namespace) -> int:
    from ..registry import ALL_REGISTRIES
    from . import command_names
    for title, registry in ALL_REGISTRIES.items():
        print(f"{title}:")
        for name in registry.names():
            print(f"  {name}")
    print(f"commands: {', '.join(command_names())}")
    return 0
