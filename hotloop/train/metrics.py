"""Metrics from summable statistics, accumulated on the device and read rarely.

:class:`StatsAccumulator` adds each step's statistics (``nll_sum``,
``tokens``, ``examples``, optionally ``correct``, ``seq_correct``) into
float64 device tensors without a host sync; :meth:`StatsAccumulator.read`
copies them to the host in ONE transfer. :func:`summarize` turns the sums
into loss, perplexity and accuracies.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

__all__ = ["StatsAccumulator", "summarize", "perplexity"]


def perplexity(loss: float) -> float:
    """``exp(loss)``, ``inf`` on overflow."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


class StatsAccumulator:
    """Device-side running sums; ``host_syncs`` counts reads (one sync each)."""

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self.host_syncs = 0

    def add(self, stats: dict[str, Tensor]) -> None:
        """Accumulate summable tensors (no host sync)."""
        for key, value in stats.items():
            value = value.detach()
            if key in self._sums:
                self._sums[key].add_(value)
            else:
                self._sums[key] = value.to(torch.float64).clone()

    def __bool__(self) -> bool:
        return bool(self._sums)

    def read(self, reduce: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None
             ) -> dict[str, float]:
        """Return the sums as floats (one device->host copy) and reset.

        ``reduce`` (e.g. a DistContext's ``all_reduce_stats``) combines the
        sums over ranks before the copy.
        """
        sums, self._sums = self._sums, {}
        if not sums:
            return {}
        if reduce is not None:
            sums = reduce(sums)
        keys = sorted(sums)
        values = torch.stack([sums[k].reshape(()) for k in keys]).tolist()  # the one sync
        self.host_syncs += 1
        return dict(zip(keys, values))


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """loss = nll_sum / tokens, ppl = exp(loss), accuracy = correct / tokens,
    seq_accuracy = seq_correct / examples (each only when its inputs exist)."""
    out: dict[str, float] = {}
    tokens = sums.get("tokens", 0.0)
    if "nll_sum" in sums and tokens > 0:
        out["loss"] = sums["nll_sum"] / tokens
        out["ppl"] = perplexity(out["loss"])
    if "correct" in sums and tokens > 0:
        out["accuracy"] = sums["correct"] / tokens
    if "seq_correct" in sums and sums.get("examples", 0.0) > 0:
        out["seq_accuracy"] = sums["seq_correct"] / sums["examples"]
    for key in ("tokens", "examples"):
        if key in sums:
            out[key] = int(round(sums[key]))
    return out
