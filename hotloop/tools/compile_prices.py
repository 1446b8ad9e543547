"""What compiling a step costs here, remembered between runs so the tuner prices a cached compile as cached.

After a trial of a compiling backend (``inductor``), :func:`record_compile` keeps the measured first
call (:class:`~hotloop.engine.compile_cache.CompileStats`) under the tune-cache key (model class,
hparams, input shapes, hardware, torch) in ``<cache_dir>/compile/``. :func:`compile_price` then
answers the next tune of the same key: the measured seconds of a compile that loaded from the
compile cache; after only a cold compile (its code is now in the cache), CACHED_FRACTION of the cold
seconds (a cached load still traces the model, then loads the generated code:
``docs/data/compile_price.json`` measured 7-26% of the cold compile on the zoo models); with nothing
recorded, or with the compile cache folder gone, :func:`cold_compile_price`: a fixed start-up plus a
price per aten op of eager's step, the line ``benchmarks/compile_price.py`` fits over the zoo
models' cold compiles with a margin, never less than the proposal's default cost. A file that
cannot be read is ignored.
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
from .proposals import COMPILE_COSTS

__all__ = ["record_compile", "compile_price", "cold_compile_price", "next_compile_prices", "CACHED_FRACTION",
           "COLD_FIXED_SECONDS", "COLD_SECONDS_PER_OP"]

#: price of a compile whose code the cache holds, as a share of the cold compile (a cautious upper bound)
CACHED_FRACTION = 0.3
#: a cold inductor compile's fixed seconds and seconds per aten op of eager's step as the tuner counts
#: it (forward, backward and per-tensor update), fitted on the 2-core EPYC with a margin
#: (``docs/data/compile_price.json``); measured on that machine only
COLD_FIXED_SECONDS = 30.5
COLD_SECONDS_PER_OP = 0.0345


def cold_compile_price(ops_per_step: int, floor: float) -> float:
    """Seconds a cold compile of a step of ``ops_per_step`` aten ops should take here, at least ``floor``."""
    return max(floor, COLD_FIXED_SECONDS + COLD_SECONDS_PER_OP * ops_per_step)


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


def next_compile_prices(key: dict[str, Any], ops_per_step: int) -> dict[str, float]:
    """Compiling backend -> the price of its next compile for ``key``, a step of ``ops_per_step`` ops."""
    return {backend: compile_price(key, backend, cold_compile_price(ops_per_step, COMPILE_COSTS[backend]))[0]
            for backend in ("inductor",)}
