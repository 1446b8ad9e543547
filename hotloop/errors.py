"""The one base class of errors a user can cause and fix.

The CLI reports any :class:`UserError` as one line ``hotloop: error: ...``
and exits 2. Library errors that describe bad input (names, overrides,
data, checkpoints, strategies) subclass it.
"""
from __future__ import annotations

__all__ = ["UserError", "StrategyError"]


class UserError(Exception):
    """Bad input: an unknown name, a bad value, unusable data or files."""


class StrategyError(UserError, ValueError):
    """A Strategy field that is invalid, or does not apply to this hardware or model.

    Defined here (not in :mod:`hotloop.engine.strategy`, which re-exports it) so that
    :mod:`hotloop.optim`, below the engine, can raise it too.
    """
