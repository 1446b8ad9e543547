"""Tools around the training loop: the autotuner (``strategy="auto"``) and the speed doctor.

Submodules are imported on use (``from hotloop.tools.autotune import tune``),
so importing :mod:`hotloop.tools` stays cheap. See ``docs/tune.md``.

- ``autotune`` (+ ``hardware``, ``model_facts``, ``proposals``, ``trials``, ``tune_cache``,
  ``tune_report``, ``isolation``): ``tune`` (``hotloop tune``; ``hotloop.auto_strategy`` is its one-liner)
- ``profile`` (+ ``profile_report``, ``profile_advice``): the speed doctor (``hotloop profile``)
"""
from __future__ import annotations

__all__: list[str] = []
