"""Keep freed host memory in the process, so a training step does not page-fault.

A CPU training step allocates and frees the same large buffers every step
(logits, probabilities, gradients, activations of many MiB). glibc's malloc
serves blocks above its mmap threshold with fresh ``mmap`` pages and returns
freed memory at the top of the heap to the kernel once it passes the trim
threshold, so the next step touches new pages: thousands of minor page faults
per step (about 5,800 on the bf16 ``lstm_lm_small`` step, which runs 1.31x faster
without them: ``benchmarks/host_memory.py``, ``docs/results.md``). :func:`keep_freed_memory` fixes both thresholds
(``mallopt``): blocks up to 32 MiB come from the heap and freed memory stays
mapped for the next step. The process's resident size then stays at its peak.

:func:`~hotloop.engine.step.compile_step` (and the phased-step builder) call it,
so every step ``build_step`` makes (train, tune, profile, bench) gets it. ``HOTLOOP_KEEP_FREED_MEMORY=0`` turns it off.
On a C library other than glibc it does nothing and says why.
"""
from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "ENV_SWITCH"]

ENV_SWITCH = "HOTLOOP_KEEP_FREED_MEMORY"
#: glibc's largest allowed mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD_BYTES = 32 << 20
#: free memory at the heap's top kept before any is returned to the kernel
TRIM_THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3          # glibc's mallopt parameter numbers

_outcome: str | None = None


def keep_freed_memory() -> str:
    """Set glibc's trim and mmap thresholds once per process; a line saying what was done."""
    global _outcome
    if _outcome is not None:
        return _outcome
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        _outcome = f"host memory: glibc defaults kept ({ENV_SWITCH}=0)"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _outcome = "host memory: not glibc, malloc thresholds left as they are"
    else:
        libc = ctypes.CDLL(None)
        ok = (libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
              and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)
        _outcome = ("host memory: freed blocks up to 32 MiB stay mapped (glibc mallopt)" if ok
                    else "host memory: glibc refused mallopt; malloc thresholds left as they are")
    return _outcome
