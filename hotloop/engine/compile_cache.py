"""Where compiled steps are kept between runs, and what one compilation cost.

``backend="inductor"`` compiles the forward + loss with ``torch.compile``; inductor's FX-graph cache
and AOT-autograd cache keep the generated code on disk, keyed by the graph, its input shapes and
dtypes, the torch version and the compile settings, so a changed model or shape compiles again
and an unchanged one loads the code instead. :func:`use_compile_cache` keeps that cache in
hotloop's cache folder (``$HOTLOOP_CACHE_DIR/inductor`` or ``~/.cache/hotloop/inductor``; a
``TORCHINDUCTOR_CACHE_DIR`` the user set wins) with both caches on. :func:`measure_compile`
times a first call and reads inductor's cache counters, so a report (and the tuner's price of
the next compile) says whether the code was compiled or loaded.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = ["CompileStats", "compile_cache_dir", "use_compile_cache", "measure_compile", "INDUCTOR_DIR_ENV"]

INDUCTOR_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _user_inductor_dir() -> str | None:
    """``TORCHINDUCTOR_CACHE_DIR`` when the user set it (torch writes its own default there on first use)."""
    value = os.environ.get(INDUCTOR_DIR_ENV)
    if not value:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    return None if os.path.abspath(value) == os.path.abspath(default_cache_dir()) else value


def compile_cache_dir() -> Path:
    """The user's ``$TORCHINDUCTOR_CACHE_DIR``, else ``$HOTLOOP_CACHE_DIR/inductor`` or ``~/.cache/hotloop/inductor``."""
    user = _user_inductor_dir()
    if user:
        return Path(user)
    root = os.environ.get("HOTLOOP_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "hotloop") / "inductor"


def use_compile_cache() -> Path:
    """Keep inductor's FX-graph and AOT-autograd caches on, on disk in :func:`compile_cache_dir`."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    path = compile_cache_dir()
    os.environ[INDUCTOR_DIR_ENV] = str(path)
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path


@dataclass
class CompileStats:
    """One compilation: seconds of the first call and inductor's cache hits and misses during it."""

    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)   # fxgraph_cache_hit/miss, autograd_cache_hit/miss

    @property
    def cached(self) -> bool:
        """Every graph came from the disk cache (nothing was compiled)."""
        hits = self.counts.get("fxgraph_cache_hit", 0) + self.counts.get("autograd_cache_hit", 0)
        misses = self.counts.get("fxgraph_cache_miss", 0) + self.counts.get("autograd_cache_miss", 0)
        return hits > 0 and misses == 0

    def merge(self, other: "CompileStats") -> None:
        """Add ``other``'s seconds and counts (a later part of the same first call)."""
        self.seconds += other.seconds
        for name, count in other.counts.items():
            self.counts[name] = self.counts.get(name, 0) + count

    def line(self) -> str:
        c = self.counts
        return (f"{'loaded from the compile cache' if self.cached else 'compiled'} in {self.seconds:.1f} s "
                f"(FX graphs: {c.get('fxgraph_cache_hit', 0)} cached / {c.get('fxgraph_cache_miss', 0)} compiled; "
                f"AOT autograd: {c.get('autograd_cache_hit', 0)} cached / {c.get('autograd_cache_miss', 0)} compiled)")


_COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"),
             ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"))


def _read_counters() -> dict[str, int]:
    from torch._dynamo.utils import counters
    return {name: int(counters[group][name]) for group, name in _COUNTERS}


@contextmanager
def measure_compile() -> Iterator[CompileStats]:
    """Time the block and count inductor's cache hits and misses in it (filled in on exit)."""
    stats = CompileStats()
    before = _read_counters()
    start = time.perf_counter()
    try:
        yield stats
    finally:
        stats.seconds = time.perf_counter() - start
        after = _read_counters()
        stats.counts = {name: after[name] - before[name] for name in after}
