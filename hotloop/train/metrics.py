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
    """Metrics from summed statistics (each only when its inputs exist):

    - ``loss = nll_sum / tokens``, ``ppl = exp(loss)``, ``accuracy = correct / tokens``,
      ``seq_accuracy = seq_correct / examples``;
    - ``<x>_loss = <x>_nll_sum / <x>_examples`` and ``<x>_accuracy = <x>_correct / <x>_examples``
      (a secondary head, e.g. BERT's next-sentence ``nsp``);
    - ``<x> = <x>_sum / examples`` for every other ``*_sum`` (per-example means: GAN, cycle, box losses);
      a ``phase/`` prefix (later phases of a step program) divides by ``phase/examples``;
    - ``miou``: the mean over present classes of ``inter_<c> / union_<c>``.
    """
    out: dict[str, float] = {}
    tokens = sums.get("tokens", 0.0)
    if "nll_sum" in sums and tokens > 0:
        out["loss"] = sums["nll_sum"] / tokens
        out["ppl"] = perplexity(out["loss"])
    if "correct" in sums and tokens > 0:
        out["accuracy"] = sums["correct"] / tokens
    if "seq_correct" in sums and sums.get("examples", 0.0) > 0:
        out["seq_accuracy"] = sums["seq_correct"] / sums["examples"]
    for key, value in sums.items():
        prefix, _, base = key.rpartition("/")
        scope = f"{prefix}/" if prefix else ""
        if base.endswith("_nll_sum") and sums.get(f"{scope}{base[:-8]}_examples", 0.0) > 0:
            head = base[:-8]
            out[f"{scope}{head}_loss"] = value / sums[f"{scope}{head}_examples"]
            if f"{scope}{head}_correct" in sums:
                out[f"{scope}{head}_accuracy"] = sums[f"{scope}{head}_correct"] / sums[f"{scope}{head}_examples"]
        elif base.endswith("_sum") and base != "nll_sum" and sums.get(f"{scope}examples", 0.0) > 0:
            out[key[:-4]] = value / sums[f"{scope}examples"]
    present = [k[len("union_"):] for k in sums if k.startswith("union_") and sums[k] > 0]
    if present:
        out["miou"] = sum(sums[f"inter_{c}"] / sums[f"union_{c}"] for c in present) / len(present)
    for key in ("tokens", "examples"):
        if key in sums:
            out[key] = int(round(sums[key]))
    return out
