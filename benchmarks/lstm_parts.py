"""Parts of the LSTM benchmarks: the machine they ran on, and the per-round GEMM floor."""
from __future__ import annotations

import statistics
from typing import Any

import torch

from hotloop.ops.cpu_isa import cpu_isa

__all__ = ["machine_facts", "machine_line", "gemm_floor_ms", "summarize_floor"]


def machine_facts() -> dict[str, Any]:
    """``{"cpu": description, "amx": bool, "isa": [...], "isa_caps": [...]}`` of this machine
    (every LSTM benchmark prints them)."""
    from hotloop.tools.hardware import detect_hardware
    hw = detect_hardware(torch.device("cpu"))
    return {"cpu": hw.describe(), "amx": "amx_bf16" in hw.cpu_bf16, "isa": list(hw.cpu_isa),
            "isa_caps": list(hw.cpu_caps)}


def machine_line(script: str) -> str:
    """The header line of an LSTM benchmark: the CPU, whether AMX is present, the thread count."""
    facts = machine_facts()
    return (f"benchmarks/{script}: {facts['cpu']}, AMX {'present' if facts['amx'] else 'absent'}, "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def gemm_floor_ms(config: str, threads: int) -> dict[str, float]:
    """The GEMM-only floor of one step (``benchmarks/lstm_floor.py``), ms, for fp32 and bf16 operands."""
    from lstm_floor import gemm_floor
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtypes = (torch.float32, torch.bfloat16) if cpu_isa().fast_bf16 else (torch.float32,)
        return {str(d).replace("torch.", ""): gemm_floor(config, d)["floor_ms"] for d in dtypes}
    finally:
        torch.set_num_threads(previous)


def summarize_floor(per_round: list[dict[str, float]], threads: int) -> dict[str, Any]:
    """Median over the timed rounds of each operand dtype's floor; the faster dtype is the floor."""
    by_dtype = {d: statistics.median(r[d] for r in per_round) for d in per_round[0]}
    best = min(by_dtype, key=by_dtype.__getitem__)
    return {"floor_ms": by_dtype[best], "dtype": best, "by_dtype_ms": by_dtype, "threads": threads,
            "per_round_ms": [r[best] for r in per_round]}
