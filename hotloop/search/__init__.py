"""Hyperparameter search with Optuna: ``hotloop search`` (see ``docs/search.md``).

:mod:`~hotloop.search.space` reads a space file, :mod:`~hotloop.search.study` opens the study,
:mod:`~hotloop.search.planning` plans the one Strategy, :mod:`~hotloop.search.worker` runs
trials (each reported by :mod:`~hotloop.search.reporter`), :mod:`~hotloop.search.jobs` runs
worker processes and :mod:`~hotloop.search.summary` writes the table and ``best.json``.
"""
from __future__ import annotations

from .space import Param, SearchSpace, SpaceError, load_space, parse_space

__all__ = ["Param", "SearchSpace", "SpaceError", "load_space", "parse_space"]
