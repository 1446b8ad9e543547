"""Facts about this machine: cores, CPU bf16 support, CUDA, and a measured GEMM peak.

The GEMM peak (fp32 and bf16 matmul FLOP/s) is measured once with a short
benchmark and cached as JSON next to the autotune cache, keyed by the
hardware fingerprint and torch version; MFU in the speed doctor divides by it.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = ["HardwareInfo", "detect_hardware", "GemmPeak", "gemm_peak", "cache_dir"]

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cache_dir() -> Path:
    """``$HOTLOOP_CACHE_DIR`` or ``~/.cache/hotloop/autotune``."""
    env = os.environ.get("HOTLOOP_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "hotloop" / "autotune"


@dataclass(frozen=True)
class HardwareInfo:
    device: str                 # "cpu" | "cuda"
    cores: int                  # CPU cores this process may use
    cpu_model: str
    cpu_bf16: tuple[str, ...]   # fast-bf16 CPU flags found (AVX512-BF16, AMX)
    cuda_name: str = ""
    cuda_capability: tuple[int, int] = (0, 0)

    @property
    def tensor_cores(self) -> bool:
        return self.device == "cuda" and self.cuda_capability >= (7, 0)

    @property
    def fast_bf16(self) -> bool:
        """bf16 matmuls run faster than fp32 (Ampere+, or CPU AVX512-BF16/AMX)."""
        if self.device == "cuda":
            return self.cuda_capability >= (8, 0)
        return bool(self.cpu_bf16)

    def fingerprint(self) -> str:
        """Stable short id of the hardware (cache key part)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        if self.device == "cuda":
            return (f"cuda {self.cuda_name} (sm_{self.cuda_capability[0]}{self.cuda_capability[1]}, "
                    f"tensor cores={'yes' if self.tensor_cores else 'no'}), {self.cores} CPU cores")
        flags = ",".join(self.cpu_bf16) or "none"
        return f"cpu {self.cpu_model} x{self.cores} cores, fast-bf16 flags: {flags}"


def _cpu_flags_and_model() -> tuple[set[str], str]:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name":
                    model = value.strip()
                if flags and key == "model name":
                    break
    except OSError:
        pass
    return flags, model


def detect_hardware(device: torch.device | str = "cpu") -> HardwareInfo:
    """Inspect the machine for ``device`` (cores via affinity, bf16 flags via /proc/cpuinfo)."""
    device = torch.device(device)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    flags, model = _cpu_flags_and_model()
    bf16 = tuple(f for f in _BF16_CPU_FLAGS if f in flags)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return HardwareInfo("cuda", cores, model, bf16, torch.cuda.get_device_name(index),
                            tuple(torch.cuda.get_device_capability(index)))
    return HardwareInfo("cpu", cores, model, bf16)


@dataclass(frozen=True)
class GemmPeak:
    fp32_flops: float   # FLOP/s of a square fp32 matmul
    bf16_flops: float   # FLOP/s of a square bf16 matmul (0 when unsupported)
    size: int
    threads: int

    def for_precision(self, precision: str) -> float:
        if precision in ("bf16", "fp16") and self.bf16_flops > 0:
            return self.bf16_flops
        return self.fp32_flops


def _time_matmul(n: int, dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    a = torch.randn(n, n, device=device).to(dtype)       # [n, n]
    b = torch.randn(n, n, device=device).to(dtype)       # [n, n]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 3:
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        times.append(time.perf_counter() - start)
    best = sorted(times)[len(times) // 4]                  # lower quartile: robust to shared cores
    return 2.0 * n ** 3 / best


def _busy(cores: int) -> bool:
    """Other work is running: the one-minute load average exceeds half the cores."""
    try:
        return os.getloadavg()[0] > cores / 2
    except (AttributeError, OSError):
        return False


def gemm_peak(hw: HardwareInfo | None = None, *, use_cache: bool = True,
              seconds: float = 0.3) -> GemmPeak:
    """Measured matmul peak of this machine (cached per hardware + threads + torch version)."""
    hw = hw or detect_hardware()
    device = torch.device("cuda" if hw.device == "cuda" else "cpu")
    threads = torch.get_num_threads()
    size = 4096 if hw.device == "cuda" else 512
    path = cache_dir() / f"gemm_peak_{hw.fingerprint()}_{threads}t_{torch.__version__}.json"
    if use_cache and path.exists():
        try:
            data = json.loads(path.read_text())
            return GemmPeak(float(data["fp32_flops"]), float(data["bf16_flops"]),
                            int(data["size"]), int(data["threads"]))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            warnings.warn(f"ignoring corrupt GEMM peak cache {path}: {exc}", stacklevel=2)
    # the benchmark must not move the caller's random stream
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    try:
        fp32 = _time_matmul(size, torch.float32, device, seconds)
        bf16 = _time_matmul(size, torch.bfloat16, device, seconds) if (
            hw.device == "cuda" or hw.fast_bf16) else 0.0
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    peak = GemmPeak(fp32, bf16, size, threads)
    if use_cache and _busy(hw.cores):
        warnings.warn(f"GEMM peak measured while the machine is busy (load average above {hw.cores / 2:.1f}); "
                      "not cached, so the next quiet measurement replaces it", stacklevel=2)
        return peak
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(peak), indent=2))
        except OSError as exc:
            warnings.warn(f"cannot write GEMM peak cache {path}: {exc}", stacklevel=2)
    return peak
