"""The CPU instruction sets this process may use: the hardware's flags, capped by the
environment switches that make a newer CPU behave like an older one.

``/proc/cpuinfo`` says what the silicon has. oneDNN honours ``ONEDNN_MAX_CPU_ISA``
(e.g. ``AVX2``) and ATen's vectorised kernels honour ``ATEN_CPU_CAPABILITY``
(e.g. ``avx2``); under either cap the kernels behave as on the older CPU, so every
speed decision (bf16 proposals, the bf16 LSTM fallback) reads the capped set.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
__all__ = ["CpuIsa", "cpu_isa", "ISA_NAMES"]

#: the instruction sets reported, oldest first
ISA_NAMES = ("avx2", "avx512", "avx512_bf16", "amx")
_HARDWARE_FLAG = {"avx2": "avx2", "avx512": "avx512f", "avx512_bf16": "avx512_bf16", "amx": "amx_bf16"}
#: oneDNN ISA names (ONEDNN_MAX_CPU_ISA), oldest first, with the highest set each allows
_ONEDNN_LEVELS = (("SSE41", 0), ("AVX", 0), ("AVX2", 1), ("AVX2_VNNI", 1), ("AVX2_VNNI_2", 1),
                  ("AVX512_CORE", 2), ("AVX512_CORE_VNNI", 2), ("AVX512_CORE_BF16", 3),
                  ("AVX512_CORE_FP16", 3), ("AVX10_1_512", 3), ("AVX512_CORE_AMX", 4),
                  ("AVX512_CORE_AMX_FP16", 4), ("AVX10_1_512_AMX", 4), ("AVX10_1_512_AMX_FP16", 4))
#: ATen capabilities (ATEN_CPU_CAPABILITY) and the highest set they allow
_ATEN_LEVELS = {"default": 0, "avx2": 1, "avx512": 4}


@dataclass(frozen=True)
class CpuIsa:
    """The CPU's instruction sets: what the hardware has and what this process may use."""

    model: str
    hardware: tuple[str, ...]     # of ISA_NAMES, from /proc/cpuinfo
    usable: tuple[str, ...]       # hardware, capped by ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY
    caps: tuple[str, ...]         # the capping settings in force, "NAME=value"

    @property
    def fast_bf16(self) -> bool:
        """bf16 matmuls run in hardware (AVX512-BF16 or AMX), so they can beat fp32."""
        return "avx512_bf16" in self.usable or "amx" in self.usable

    def describe(self) -> str:
        """``"avx2,avx512,avx512_bf16 (hardware: ...; capped by ...)"`` in one line."""
        text = ",".join(self.usable) or "none of " + "/".join(ISA_NAMES)
        if self.caps:
            text += f" (hardware {','.join(self.hardware) or 'none'}; capped by {' '.join(self.caps)})"
        return text


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[set[str], str]:
    """The first CPU's flags and its name with its x86 family and model numbers, which tell
    generations apart where a VM names only the line: "AMD EPYC (family 26, model 2)"."""
    model = platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if not key:
                    break                                  # the first CPU's block ends
                fields.setdefault(key, value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    model = fields.get("model name", model)
    if "cpu family" in fields and "model" in fields:
        model += f" (family {fields['cpu family']}, model {fields['model']})"
    return flags, model


def _level_cap() -> tuple[int, tuple[str, ...]]:
    """The highest index into ISA_NAMES the environment allows (+1), and the caps in force."""
    level, caps = len(ISA_NAMES), []
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if onednn and onednn.upper() not in ("ALL", "DEFAULT"):
        allowed = dict(_ONEDNN_LEVELS).get(onednn.upper())
        if allowed is not None:
            level = min(level, allowed)
            caps.append(f"ONEDNN_MAX_CPU_ISA={onednn}")
    aten = os.environ.get("ATEN_CPU_CAPABILITY")
    if aten and aten.lower() in _ATEN_LEVELS:
        level = min(level, _ATEN_LEVELS[aten.lower()])
        caps.append(f"ATEN_CPU_CAPABILITY={aten}")
    return level, tuple(caps)


@functools.lru_cache(maxsize=1)
def cpu_isa() -> CpuIsa:
    """The instruction sets of this CPU and of this process (read once per process, as the
    kernels read their caps once)."""
    flags, model = _cpuinfo()
    hardware = tuple(name for name in ISA_NAMES if _HARDWARE_FLAG[name] in flags)
    level, caps = _level_cap()
    usable = tuple(name for name in hardware if ISA_NAMES.index(name) < level)
    return CpuIsa(model, hardware, usable, caps)
