"""The process-wide settings hotloop makes, in one named place.

:func:`apply_process_settings` makes them once per process and returns one line
each for the run's notices. The CLI (before any command), ``Trainer.fit`` and
the autotuner call it; importing hotloop changes nothing in the process.

- **oneDNN's primitive cache** holds 16,384 primitives instead of 1,024: the
  autotuner's interleaved candidates (fp32/bf16, NCHW/channels_last) otherwise
  evict each other's and trials time primitive re-creation (``docs/tune.md``).
  oneDNN reads ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` at its first primitive (libtorch
  exports no call to change it later), so the CLI applies the settings before any
  command; a Python program that runs oneDNN kernels before ``Trainer.fit`` calls
  :func:`apply_process_settings` first. A value the user set wins.
- **Host memory kept mapped between steps** (:func:`~hotloop.engine.host_memory.
  keep_freed_memory`; ``HOTLOOP_KEEP_FREED_MEMORY=0`` turns it off).
"""
from __future__ import annotations

import os

from .host_memory import keep_freed_memory

__all__ = ["apply_process_settings", "ONEDNN_CACHE_CAPACITY", "ONEDNN_CACHE_ENV"]

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 16384

_applied: list[str] | None = None


def _set_onednn_cache() -> str:
    user = os.environ.get(ONEDNN_CACHE_ENV)
    if user is not None and user != str(ONEDNN_CACHE_CAPACITY):
        return f"oneDNN primitive cache: {user} entries ({ONEDNN_CACHE_ENV} set by the user)"
    os.environ[ONEDNN_CACHE_ENV] = str(ONEDNN_CACHE_CAPACITY)   # read at oneDNN's first primitive
    return f"oneDNN primitive cache: {ONEDNN_CACHE_CAPACITY} entries"


def apply_process_settings() -> list[str]:
    """Make hotloop's process-wide settings (once per process); one notice line each."""
    global _applied
    if _applied is None:
        _applied = [_set_onednn_cache(), keep_freed_memory()]
    return list(_applied)
