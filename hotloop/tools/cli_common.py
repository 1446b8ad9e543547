"""Arguments and error handling shared by ``hotloop tune`` and ``hotloop profile``."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

__all__ = ["add_run_arguments", "build_from_args", "run_cli", "planned_steps"]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--problem/--model/--hparams/--override/--import/--data-dir/--device (as ``hotloop train``)."""
    from ..cli import DEFAULT_MODEL, DEFAULT_PROBLEM
    parser.add_argument("--problem", default=DEFAULT_PROBLEM)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--hparams", default=None, help="hparams set (default: the problem's default)")
    parser.add_argument("--override", default="", help='hparams overrides "k=v,k=v"')
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MOD",
                        help="import a module (dotted name or .py path) that registers components")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--raw-dir", default=None)
    parser.add_argument("--device", default="cpu", help="cpu | cuda")


def build_from_args(args: argparse.Namespace) -> Any:
    """Import user modules, check the device and build the run (``hotloop.train.build.build_run``)."""
    from ..cli import _check_device, _import_modules
    from ..train.build import build_run
    _check_device(args.device)
    _import_modules(args.imports)
    return build_run(args.problem, args.model, args.hparams, args.override or None,
                     data_dir=args.data_dir, raw_dir=args.raw_dir, device=args.device)


def planned_steps(problem: Any, hp: Any) -> int | None:
    """Steps of a default run: ``max_steps``, else ``max_epochs`` x batches per epoch (None if unknown)."""
    if hp.max_steps:
        return int(hp.max_steps)
    if not hp.max_epochs:
        return None
    reader = problem.reader("train", hp)
    try:
        return int(hp.max_epochs) * len(reader)
    except TypeError:
        return None
    finally:
        close = getattr(reader, "close", None)
        if callable(close):
            close()


def run_cli(body: Callable[[], int]) -> int:
    """Run ``body``; a user error becomes one ``hotloop: error: ...`` line and exit code 2."""
    from ..cli import _user_errors
    from ..data.errors import DataError
    try:
        return body()
    except (*_user_errors(), DataError, ValueError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"hotloop: error: {message}", file=sys.stderr)
        return 2
