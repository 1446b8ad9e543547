"""Where a run's data lives, recorded by ``hotloop train`` and reused by ``eval``, ``decode``,
``export`` and ``--resume``.

``run.json`` (and every checkpoint's run info) records the prepared-data directory and the
raw-file directory as absolute paths, and the roots that were in effect: ``raw_root``
(``--raw-root`` / ``HOTLOOP_RAW_ROOT``) and ``data_root`` (``HOTLOOP_DATA_DIR``). A later
command that names none of them gets the recorded ones (a recorded root only while it is a
directory); what the command line gives explicitly wins. A recorded root also wins over the
environment variable of the later shell, so a run trained with ``--raw-root R`` is evaluated
against ``R`` wherever it is evaluated from.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

__all__ = ["RAW_ROOT_ENV", "DATA_ROOT_ENV", "RunData", "record_data_paths", "recorded_data", "using_roots"]

RAW_ROOT_ENV = "HOTLOOP_RAW_ROOT"
DATA_ROOT_ENV = "HOTLOOP_DATA_DIR"


def _absolute(path: str | os.PathLike[str] | None) -> str | None:
    return os.path.abspath(os.fspath(path)) if path else None


@dataclass(frozen=True)
class RunData:
    """The data paths a command uses (None: the problem's default, from the environment)."""

    data_dir: str | None = None
    raw_dir: str | None = None
    raw_root: str | None = None
    data_root: str | None = None


def record_data_paths(data_dir: str | os.PathLike[str] | None, raw_dir: str | os.PathLike[str] | None
                      ) -> dict[str, str | None]:
    """The run-info entries ``hotloop train`` records: the given directories and the roots in effect."""
    return {"data_dir": _absolute(data_dir), "raw_dir": _absolute(raw_dir),
            "raw_root": _absolute(os.environ.get(RAW_ROOT_ENV)), "data_root": _absolute(os.environ.get(DATA_ROOT_ENV))}


def _existing_dir(path: Any) -> str | None:
    return str(path) if isinstance(path, str) and path and os.path.isdir(path) else None


def recorded_data(run: Mapping[str, Any] | None, *, data_dir: str | None = None, raw_dir: str | None = None,
                  raw_root: str | None = None) -> RunData:
    """The paths to use for a recorded run: the explicit ones, else the recorded ones.

    A raw root given explicitly also replaces the recorded raw directory (the raw files are
    then looked up under the new root).
    """
    run = run or {}
    recorded_raw_dir = run.get("raw_dir") if isinstance(run.get("raw_dir"), str) else None
    recorded_data_dir = run.get("data_dir") if isinstance(run.get("data_dir"), str) else None
    return RunData(data_dir=_absolute(data_dir) or recorded_data_dir or None,
                   raw_dir=_absolute(raw_dir) or (None if raw_root else recorded_raw_dir) or None,
                   raw_root=_absolute(raw_root) or _existing_dir(run.get("raw_root")),
                   data_root=_existing_dir(run.get("data_root")))


@contextlib.contextmanager
def using_roots(data: RunData) -> Iterator[None]:
    """``HOTLOOP_RAW_ROOT`` / ``HOTLOOP_DATA_DIR`` set to ``data``'s roots inside the block (problems
    read them when they are constructed); the previous values come back afterwards."""
    changes = {name: value for name, value in ((RAW_ROOT_ENV, data.raw_root), (DATA_ROOT_ENV, data.data_root))
               if value}
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
