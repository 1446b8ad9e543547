"""What every ``hotloop`` command shares: the run flags, device and import handling, errors.

The run flags (``--problem --model --hparams --override --data-dir --raw-dir
--raw-root --device --strategy-override``) are defined here once, with the
same defaults for every command that builds a run.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Sequence

from ..errors import UserError

__all__ = ["CLIError", "DEFAULT_PROBLEM", "DEFAULT_MODEL", "add_run_flags", "add_import_flag",
           "resolve_device", "import_modules", "build_from_args", "apply_raw_root", "stops_at_once"]

DEFAULT_PROBLEM = "algorithmic_reverse"
DEFAULT_MODEL = "transformer"


class CLIError(UserError):
    """A bad command line the CLI reports as one line."""


def add_import_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MOD",
                        help="import a module (dotted name or .py path) that registers components; repeatable")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that name a run, its data, its device and its Strategy overrides."""
    parser.add_argument("--problem", default=DEFAULT_PROBLEM)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--hparams", default=None, help="hparams set (default: the problem's default)")
    parser.add_argument("--override", default="", help='hparams overrides "k=v,k=v"')
    parser.add_argument("--data-dir", default=None, help="prepared data (default: $HOTLOOP_DATA_DIR/<problem>)")
    parser.add_argument("--raw-dir", default=None, help="this problem's raw files")
    parser.add_argument("--raw-root", default=None, metavar="DIR",
                        help="raw-data root: problem P reads DIR/<P's folder> (same as HOTLOOP_RAW_ROOT=DIR)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu) | cpu | cuda[:N]")
    parser.add_argument("--strategy-override", default=None, help='Strategy overrides "k=v,k=v"')


def apply_raw_root(args: argparse.Namespace) -> None:
    """``--raw-root DIR`` sets ``HOTLOOP_RAW_ROOT`` for this command and the workers it starts."""
    root = getattr(args, "raw_root", None)
    if root:
        if not os.path.isdir(root):
            raise CLIError(f"--raw-root {root}: not a directory")
        os.environ["HOTLOOP_RAW_ROOT"] = os.path.abspath(root)


def stops_at_once() -> Any:
    """A context in which SIGINT/SIGTERM/SIGUSR1 raise :class:`~hotloop.train.interrupt.Interrupted`
    at once (``exit_code`` 130/143/138): for work with nothing to save, such as datagen, whose
    shards are written under temporary names and trusted only once the manifest is written."""
    from ..train.interrupt import Interrupted, StopSignalGuard

    def stop(signum: int) -> None:
        raise Interrupted(signum)
    return StopSignalGuard(stop)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; a CUDA device that is not there is an error."""
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise CLIError(f"--device {device!r}: use auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device}: no CUDA device is available")
    return device


def import_modules(specs: Sequence[str]) -> None:
    """Import each ``--import`` module (its registrations become visible); failures are one line."""
    from ..registry import import_user_module
    for spec in specs:
        try:
            import_user_module(spec)
        except Exception as exc:  # noqa: BLE001 - any failure in user code is reported in one line
            raise CLIError(f"--import {spec}: {type(exc).__name__}: {exc}") from None


def build_from_args(args: argparse.Namespace, *, prepare: bool = True) -> Any:
    """The run named by the run flags (:func:`hotloop.compose.build.build_run`), on ``args.device``."""
    from ..compose.build import build_run
    return build_run(args.problem, args.model, args.hparams, args.override or None,
                     data_dir=args.data_dir, raw_dir=args.raw_dir, device=args.device, prepare=prepare)
