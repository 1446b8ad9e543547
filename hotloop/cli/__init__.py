"""The ``hotloop`` command: one module per subcommand, plugins through entry points.

A command is a module with ``NAME``, ``HELP``, ``RUN_FLAGS`` (whether it takes the
shared run flags of :mod:`hotloop.cli.common`), ``add_arguments(parser)`` and
``run(args) -> int``. Built-in commands are the modules named in
:data:`BUILTIN_COMMANDS`; other packages add commands through the entry-point
group ``hotloop.commands`` (``name = "package.module"``).

Bad input (unknown names, bad overrides, a model that does not serve the
problem, a bad strategy, an unusable checkpoint, data or output directory)
prints ONE line ``hotloop: error: ...`` on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points
from types import ModuleType
from typing import Sequence

from ..errors import UserError
from .common import CLIError, add_import_flag, add_run_flags, apply_raw_root, import_modules, resolve_device

__all__ = ["main", "build_parser", "command_names", "load_command", "BUILTIN_COMMANDS", "ENTRY_POINT_GROUP",
           "CLIError"]

#: modules of :mod:`hotloop.cli` that are commands, in the order ``hotloop --help`` lists them
BUILTIN_COMMANDS = ("listing", "datagen", "train", "evaluate", "decode", "explain", "tune", "profile",
                    "export", "bench", "search")
ENTRY_POINT_GROUP = "hotloop.commands"


def _builtin_modules() -> dict[str, ModuleType]:
    modules = [importlib.import_module(f"{__name__}.{name}") for name in BUILTIN_COMMANDS]
    return {m.NAME: m for m in modules}


def _plugins() -> dict[str, str]:
    """Plugin command name -> module path, from installed packages' entry points."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def command_names() -> list[str]:
    """Every command: the built-ins, then plugins."""
    return list(_builtin_modules()) + sorted(n for n in _plugins() if n not in _builtin_modules())


def load_command(name: str) -> ModuleType:
    """The module of command ``name`` (a plugin is imported here, on first use)."""
    builtins = _builtin_modules()
    if name in builtins:
        return builtins[name]
    target = _plugins().get(name)
    if target is None:
        raise CLIError(f"unknown command {name!r}; commands: {', '.join(command_names())}")
    try:
        module = importlib.import_module(target.partition(":")[0])
    except Exception as exc:  # noqa: BLE001 - a broken plugin is reported in one line
        raise CLIError(f"command {name!r} (plugin {target}) failed to import: {type(exc).__name__}: {exc}") from None
    missing = [a for a in ("NAME", "HELP", "add_arguments", "run") if not hasattr(module, a)]
    if missing:
        raise CLIError(f"command {name!r} (plugin {target}) lacks {', '.join(missing)}")
    return module


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``only``, plugins other than that command are listed but not imported."""
    parser = argparse.ArgumentParser(prog="hotloop", description="Fast, modular training on PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = dict(_builtin_modules())
    for name, target in _plugins().items():
        if name not in modules:
            if only is None or only == name:
                modules[name] = load_command(name)
            else:
                sub.add_parser(name, help=f"(plugin {target})", add_help=False)
    for name, module in modules.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        add_import_flag(p)
        if getattr(module, "RUN_FLAGS", False):
            add_run_flags(p)
        module.add_arguments(p)
        p.set_defaults(command_module=module)
    return parser


def _check_run_lock(argv: list[str]) -> None:
    """Before starting workers: refuse at once when ``--output-dir`` is held by another run.

    Only a check (nothing is written); global rank 0 takes the lock itself
    (:func:`hotloop.cli.train.take_run_lock`), which also covers a directory from ``--config``.
    """
    from pathlib import Path
    from .cli_support import flag_text
    from ..train.runlock import check_unlocked
    out = flag_text(argv, "--output-dir")
    try:
        wait = max(0.0, float(flag_text(argv, "--wait-for-lock") or 0))
    except ValueError:
        wait = 0.0  # the train parser reports the bad value
    if out:
        check_unlocked(Path(out), wait)


def _launch_workers(argv: list[str]) -> int | None:
    """``hotloop train --nproc N``: run N workers and return the job's exit code (None: train here)."""
    from .cli_support import flag_value, in_worker, job_nodes, maybe_launch
    if not argv or argv[0] != "train" or in_worker():
        return None
    try:
        nodes = job_nodes(argv)
        if flag_value(argv, "--nproc", 1) <= 1 and nodes is None:
            return None
    except UserError:
        nodes = None
        if "--nnodes" not in argv and not any(a.startswith("--nnodes=") for a in argv):
            return None  # the train parser reports the bad value
    if nodes is None:
        _check_run_lock(argv)   # several nodes: global rank 0, wherever it runs, takes the lock
    return maybe_launch(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hotloop`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    from ..engine.process_settings import apply_process_settings
    apply_process_settings()     # before any oneDNN primitive exists (the cache size is read once)
    try:
        code = _launch_workers(args_list)
        if code is not None:
            return code
        parser = build_parser(only=args_list[0] if args_list else None)
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return 2
        args.command_argv = args_list[1:]   # what was typed after the command name (``hotloop train``'s config)
        import_modules(args.imports)
        apply_raw_root(args)
        if hasattr(args, "device"):
            args.device = resolve_device(args.device)
        return int(args.command_module.run(args) or 0)
    except (UserError, FileNotFoundError, PermissionError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"hotloop: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:   # a stop signal outside training (datagen, tuning): 128 + signal
        print(f"hotloop: interrupted ({exc or 'SIGINT'})", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
