"""The composition root: names -> problem/model/hparams, the run's one Strategy, reloading a run.

It sits above :mod:`hotloop.train` (and the tools it may call, the autotuner) and below the CLI:

- ``build`` (:func:`build_run`, :func:`resolve_names`): registry names and overrides -> a built run;
- ``plan`` (:class:`StrategyRequest`, :func:`plan_strategy`, :func:`auto_strategy`): the Strategy,
  validated once when it is planned;
- ``config`` (:func:`load_config`): ``hotloop train --config`` files, typed;
- ``restore`` (:func:`load_trained`, :func:`find_checkpoint`, :func:`evaluate_checkpoint`): a run
  rebuilt from its checkpoint.

Submodules are imported on use, so importing :mod:`hotloop.compose` stays cheap.
"""
from __future__ import annotations

__all__: list[str] = []
