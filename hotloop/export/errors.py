"""Errors of the export package and the optional-dependency check.

Every error here is a :class:`~hotloop.errors.UserError`: the CLI prints it as
one line and exits 2.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from ..errors import UserError

__all__ = ["ExportError", "ExportFileError", "DataDependentControlFlowError", "MissingExtraError",
           "require", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'hotloop[export]'"


class ExportError(UserError):
    """A model or run that cannot be exported (or loaded back) as asked."""


class ExportFileError(ExportError):
    """An exported file that is missing, truncated or corrupt; the message names the file."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {reason}")


class DataDependentControlFlowError(ExportError):
    """Python control flow that depends on tensor values, which a static graph cannot hold."""


class MissingExtraError(UserError, ImportError):
    """An optional dependency of export/bench is not installed."""


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(f"{purpose} needs the Python package {module.split('.')[0]!r} "
                                f"({exc.__class__.__name__}: {exc}); {INSTALL_HINT}") from None
