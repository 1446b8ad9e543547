"""The process settings keep freed host memory mapped: a step's repeated large buffers stop page-faulting."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

#: a step-like pattern of large buffers of several sizes, allocated, touched and freed each iteration
PROGRAM = """
import ctypes, resource, torch
libc = ctypes.CDLL(None)              # glibc's initial thresholds, without their dynamic raise,
libc.mallopt(-1, 128 << 10)           # so that the run without the setting faults every time
libc.mallopt(-3, 128 << 10)
from hotloop.engine.process_settings import apply_process_settings
print([line for line in apply_process_settings() if line.startswith("host memory")][0])
def iteration():
    buffers = [torch.empty(mib << 20, dtype=torch.uint8).fill_(1) for mib in (1, 8, 3, 20, 2, 16)]
    del buffers
for _ in range(5):
    iteration()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    iteration()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _run(switch: str | None) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "HOTLOOP_KEEP_FREED_MEMORY"}
    if switch is not None:
        env["HOTLOOP_KEEP_FREED_MEMORY"] = switch
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True)
    note, faults = out.stdout.strip().splitlines()[-2:]
    return note, float(faults)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_process_settings_keep_freed_memory_and_the_switch_turns_it_off() -> None:
    note, kept = _run(None)
    assert note == "host memory: freed blocks up to 32 MiB stay mapped (glibc mallopt)"
    # 50 MiB of buffers per iteration: 12,800 pages when every one is faulted in again; kept,
    # at most an occasional heap growth (fragmentation) faults a few
    assert kept < 1000
    note, refaulted = _run("0")
    assert note == "host memory: glibc defaults kept (HOTLOOP_KEEP_FREED_MEMORY=0)"
    assert refaulted > 10_000 and refaulted > 10 * kept   # small thresholds: mmap and unmap each time
