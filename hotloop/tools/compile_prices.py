"""What compiling a step costs here, remembered between runs so the tuner prices a cached compile as cached.

After a trial of a compiling backend (``inductor``), :func:`record_compile` keeps the measured first
call (:class:`~hotloop.engine.compile_cache.CompileStats`) under the tune-cache key (model class,
hparams, input shapes, hardware, torch) in ``<cache_dir>/compile/``. :func:`compile_price` then
answers the next tune of the same key: the measured seconds of a compile that loaded from the
compile cache; after only a cold compile (its code is now in the cache), a tenth of the cold
seconds (a cached load takes a few percent of the cold compile: ``tests/engine/test_compile_cache.py``
prints both); with nothing recorded, or with the compile cache folder gone, the proposal's default
cost. A file that cannot be read is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..engine.compile_cache import CompileStats, compile_cache_dir
from .hardware import cache_dir

__all__ = ["record_compile", "compile_price", "CACHED_FRACTION"]

#: price of a compile whose code the cache holds, as a share of the cold compile (a cautious upper bound)
CACHED_FRACTION = 0.1


def _path(key: dict[str, Any], backend: str) -> Path:
    digest = hashlib.sha256(json.dumps({**key, "backend": backend}, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir() / "compile" / f"{digest[:32]}.json"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and all(isinstance(record.get(k), (int, float)) for k in ("cold_s",))
    return record if ok else None


def record_compile(key: dict[str, Any], backend: str, stats: CompileStats) -> None:
    """Remember ``stats`` (a cold compile or a cached load) for ``key`` and ``backend``."""
    path = _path(key, backend)
    record = _read(path) or {"cold_s": 0.0}
    if stats.cached:
        record["cached_s"] = round(stats.seconds, 3)
    else:
        record["cold_s"] = round(stats.seconds, 3)
    record["compile_dir"] = str(compile_cache_dir())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def compile_price(key: dict[str, Any], backend: str, default: float) -> tuple[float, str]:
    """(seconds the next compile of ``backend`` should take, why) for ``key``."""
    record = _read(_path(key, backend))
    if record is None:
        return default, "not compiled here before"
    folder = Path(record.get("compile_dir", ""))
    if not folder.is_dir() or not any(folder.iterdir()):
        return default, "the compile cache folder is gone"
    if isinstance(record.get("cached_s"), (int, float)):
        return float(record["cached_s"]), "cached compile (measured)"
    if record["cold_s"] > 0:
        return CACHED_FRACTION * float(record["cold_s"]), f"cached compile (after a {record['cold_s']:.0f} s cold one)"
    return default, "not compiled here before"
