"""Facts about this machine: cores, CPU instruction sets (AVX2, AVX-512, AVX512-BF16, AMX,
as capped by ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY``), CUDA bf16/TF32, and a
measured GEMM peak.

The GEMM peak (fp32 and bf16 matmul FLOP/s) is measured once with a short
benchmark and cached as JSON next to the autotune cache, keyed by the
hardware fingerprint and torch version; MFU in the speed doctor divides by it.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..ops.cpu_isa import cpu_isa
from ..ops.linear_gemm import linear

__all__ = ["HardwareInfo", "detect_hardware", "GemmPeak", "gemm_peak", "cache_dir", "machine_header"]

#: the usable instruction sets that make CPU bf16 matmuls fast, by their /proc/cpuinfo names
_BF16_CPU_FLAGS = {"avx512_bf16": "avx512_bf16", "amx": "amx_bf16"}


def cache_dir() -> Path:
    """``$HOTLOOP_CACHE_DIR`` or ``~/.cache/hotloop/autotune``."""
    env = os.environ.get("HOTLOOP_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "hotloop" / "autotune"


@dataclass(frozen=True)
class HardwareInfo:
    device: str                 # "cpu" | "cuda"
    cores: int                  # CPU cores this process may use
    cpu_model: str
    cpu_bf16: tuple[str, ...]   # usable fast-bf16 CPU flags (avx512_bf16, amx_bf16)
    cuda_name: str = ""
    cuda_capability: tuple[int, int] = (0, 0)
    cpu_isa: tuple[str, ...] = ()   # usable instruction sets (hotloop.ops.cpu_isa.ISA_NAMES)
    cpu_caps: tuple[str, ...] = ()  # ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY caps in force

    @property
    def tensor_cores(self) -> bool:
        return self.device == "cuda" and self.cuda_capability >= (7, 0)

    @property
    def cuda_bf16(self) -> bool:
        """bf16 tensor cores (Ampere and newer)."""
        return self.device == "cuda" and self.cuda_capability >= (8, 0)

    @property
    def cuda_tf32(self) -> bool:
        """TF32 tensor cores for fp32 matmuls (Ampere and newer)."""
        return self.device == "cuda" and self.cuda_capability >= (8, 0)

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
        isa = ",".join(self.cpu_isa) or "none"
        if self.cpu_caps:
            isa += f" (capped by {' '.join(self.cpu_caps)})"
        if self.device == "cuda":
            return (f"cuda {self.cuda_name} (sm_{self.cuda_capability[0]}{self.cuda_capability[1]}, "
                    f"tensor cores={'yes' if self.tensor_cores else 'no'}, "
                    f"bf16={'yes' if self.cuda_bf16 else 'no'}, tf32={'yes' if self.cuda_tf32 else 'no'}), "
                    f"{self.cores} CPU cores, CPU ISA {isa}")
        flags = ",".join(self.cpu_bf16) or "none"
        return f"cpu {self.cpu_model} x{self.cores} cores, ISA {isa}, fast-bf16 flags: {flags}"


def detect_hardware(device: torch.device | str = "cpu") -> HardwareInfo:
    """Inspect the machine for ``device`` (cores via affinity, instruction sets via
    :func:`hotloop.ops.cpu_isa.cpu_isa`)."""
    device = torch.device(device)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    isa = cpu_isa()
    bf16 = tuple(flag for name, flag in _BF16_CPU_FLAGS.items() if name in isa.usable)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return HardwareInfo("cuda", cores, isa.model, bf16, torch.cuda.get_device_name(index),
                            tuple(torch.cuda.get_device_capability(index)), isa.usable, isa.caps)
    return HardwareInfo("cpu", cores, isa.model, bf16, cpu_isa=isa.usable, cpu_caps=isa.caps)


@dataclass(frozen=True)
class GemmPeak:
    fp32_flops: float   # FLOP/s of a square fp32 matmul, the faster of the BLAS's and oneDNN's on a CPU
    bf16_flops: float   # FLOP/s of a square bf16 matmul (0 when unsupported), likewise
    size: int
    threads: int

    def for_precision(self, precision: str) -> float:
        if precision in ("bf16", "fp16") and self.bf16_flops > 0:
            return self.bf16_flops
        return self.fp32_flops


def _time_matmul(n: int, dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    """FLOP/s of an [n, n] @ [n, n] product: ``torch.mm``, and on a CPU also oneDNN's
    (``linear_gemm="onednn"``, which a step can use), whichever is faster."""
    a = torch.randn(n, n, device=device).to(dtype)       # [n, n]
    b = torch.randn(n, n, device=device).to(dtype)       # [n, n]
    products: list[Callable[[], torch.Tensor]] = [lambda: torch.mm(a, b)]
    if device.type == "cpu":
        b_rows = b.t().contiguous()                       # [n, n] as a linear layer's weight
        products.append(lambda: linear(a, b_rows, None, "onednn"))
    return max(_flops(product, n, device, seconds) for product in products)


def _flops(product: Callable[[], torch.Tensor], n: int, device: torch.device, seconds: float) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    product()
    sync()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 3:
        start = time.perf_counter()
        product()
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
    """Measured matmul peak of this machine: the faster of the BLAS's and oneDNN's square product
    on a CPU (cached per hardware + threads + torch version)."""
    hw = hw or detect_hardware()
    device = torch.device("cuda" if hw.device == "cuda" else "cpu")
    threads = torch.get_num_threads()
    size = 4096 if hw.device == "cuda" else 512
    path = cache_dir() / f"gemm_peak_best_{hw.fingerprint()}_{threads}t_{torch.__version__}.json"
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


def machine_header(script: str = "") -> str:
    """One line every benchmark prints first: the device, the usable instruction sets (with any
    ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY`` cap), torch and its thread count."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prefix = f"{script}: " if script else ""
    return (f"# {prefix}{detect_hardware(device).describe()}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")
