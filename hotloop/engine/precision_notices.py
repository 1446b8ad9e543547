"""What a user is told when the precision they chose does not fit the hardware.

An explicit ``precision=bf16`` on a CPU without fast bf16 (no usable AVX512-BF16 or
AMX) runs, but bf16 matmuls are emulated there: the notice gives the slowdown of a
bf16 matmul against fp32 measured on this CPU. A model with ``nn.LSTM`` runs that
module in fp32 where oneDNN has no bf16 LSTM (:func:`hotloop.models.lstm_cells.
bf16_lstm_unavailable`), and the notice says so.
"""
from __future__ import annotations

import functools
import time

import torch
from torch import nn

from ..ops.cpu_isa import cpu_isa

__all__ = ["precision_notices", "bf16_matmul_slowdown"]

_PROBE_SIZE = 256          # square matmul: a few ms in fp32 on one core
_PROBE_REPEATS = 3


def _best_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    torch.mm(a, b)                                           # warm-up (oneDNN primitive creation)
    best = float("inf")
    for _ in range(_PROBE_REPEATS):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return best


@functools.lru_cache(maxsize=1)
def bf16_matmul_slowdown() -> float:
    """bf16 over fp32 seconds of a square CPU matmul, measured once per process (RNG untouched)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(_PROBE_SIZE, _PROBE_SIZE, generator=generator)      # [n, n]
    b = torch.randn(_PROBE_SIZE, _PROBE_SIZE, generator=generator)      # [n, n]
    fp32 = _best_seconds(a, b)
    bf16 = _best_seconds(a.bfloat16(), b.bfloat16())
    return bf16 / max(fp32, 1e-9)


def precision_notices(precision: str, device: torch.device, model: nn.Module) -> list[str]:
    """One line per way ``precision`` on ``device`` falls short for ``model`` (empty: none)."""
    if precision != "bf16" or device.type != "cpu":
        return []
    isa = cpu_isa()
    if isa.fast_bf16:
        return []
    notices = [f"precision=bf16 on a CPU without fast bf16 (usable ISA {isa.describe()}): a bf16 matmul "
               f"measured {bf16_matmul_slowdown():.1f}x the time of fp32 here; expect a slower run than "
               "precision=fp32"]
    if any(isinstance(m, nn.LSTM) for m in model.modules()):
        notices.append("precision=bf16: nn.LSTM runs in fp32 (oneDNN has no bf16 LSTM on this CPU); "
                       "the rest of the model runs under bf16 autocast")
    return notices
