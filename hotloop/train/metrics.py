"""Metrics from summable statistics, accumulated on the device and read rarely.

:class:`StatsAccumulator` adds each step's statistics (``nll_sum``,
``tokens``, ``examples``, optionally ``correct``, ``seq_correct``) into
float64 device tensors without a host sync; :meth:`StatsAccumulator.read`
copies them to the host in ONE transfer. :func:`summarize` turns the sums
into loss, perplexity and accuracies.

Metrics that are not sums (F1, AUROC, mAP, ...) are objects with ``update``/``compute``/``reset``
(any ``torchmetrics.Metric``), bound to the evaluation outputs they read by :class:`MetricSpec`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ..errors import UserError

__all__ = ["StatsAccumulator", "summarize", "perplexity", "MetricSpec", "DEFAULT_INPUTS", "bind_metrics",
           "compute_metrics", "reset_metrics", "unsynced_notice"]


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


# ------------------------------------------------------------ metric objects
#: where a metric's inputs come from when no name is given: ``metric.update(preds, target)``
DEFAULT_INPUTS = ("preds", "target")
#: names a metric may ask for that fall back to another output or batch key
_FALLBACKS = {"preds": "logits", "target": "targets"}


@dataclass
class MetricSpec:
    """A metric object (``update``/``compute``/``reset``: any ``torchmetrics.Metric``) and the names
    of its ``update`` arguments, looked up in the evaluation outputs, then in the batch.

    The outputs are the ``eval_step`` result (a mapping; a tensor counts as ``{"preds": t}``), or
    ``{"logits": ..., "loss": ...}`` from the loss path. ``"preds"`` falls back to ``"logits"`` and
    ``"target"`` to the batch's ``"targets"``.
    """

    metric: Any
    inputs: tuple[str, ...] = DEFAULT_INPUTS

    def __post_init__(self) -> None:
        missing = [m for m in ("update", "compute", "reset") if not callable(getattr(self.metric, m, None))]
        if missing:
            raise UserError(f"metric {type(self.metric).__name__} has no {', '.join(missing)} method; a metric "
                            f"needs update/compute/reset (e.g. a torchmetrics.Metric)")
        self.inputs = tuple(self.inputs)

    @property
    def syncs_itself(self) -> bool:
        """A ``torchmetrics.Metric`` reduces its state over ``torch.distributed`` ranks in ``compute``."""
        return any(c.__module__.startswith("torchmetrics") and c.__name__ == "Metric"
                   for c in type(self.metric).__mro__)

    def update(self, outputs: dict[str, Any], batch: Any) -> None:
        self.metric.update(*(_lookup(name, outputs, batch) for name in self.inputs))


def _lookup(name: str, outputs: dict[str, Any], batch: Any) -> Any:
    batch = batch if isinstance(batch, dict) else {}
    for key in (name, _FALLBACKS.get(name)):
        if key is None:
            continue
        if key in outputs:
            return outputs[key]
        if key in batch:
            return batch[key]
    known = sorted(set(outputs) | set(batch))
    raise UserError(f"metric input {name!r} is neither an evaluation output nor a batch key; "
                    f"there are: {', '.join(known)}")


def bind_metrics(metrics: dict[str, Any] | None, device: torch.device | None = None, world_size: int = 1,
                 notify: Callable[[str], None] | None = None) -> dict[str, MetricSpec]:
    """``{name: MetricSpec}`` from ``{name: metric object | MetricSpec}``; torch modules go to ``device``;
    with several ranks, ``notify`` hears which metrics do not reduce over them (:func:`unsynced_notice`)."""
    bound: dict[str, MetricSpec] = {}
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            raise UserError(f"metric names must be non-empty strings, got {name!r}")
        spec = value if isinstance(value, MetricSpec) else MetricSpec(value)
        if device is not None and isinstance(spec.metric, torch.nn.Module):
            spec.metric = spec.metric.to(device)
        bound[name] = spec
    notice = unsynced_notice(bound, world_size)
    if notice and notify is not None:
        notify(notice)
    return bound


def compute_metrics(metrics: dict[str, MetricSpec]) -> dict[str, float]:
    """Each metric's value (a 0-d result as ``name``, a vector as ``name/i``, a mapping as
    ``name/key``), then reset. A ``torchmetrics.Metric`` syncs over ranks here (all ranks call it)."""
    out: dict[str, float] = {}
    for name, spec in metrics.items():
        value = spec.metric.compute()
        spec.metric.reset()
        items = value.items() if isinstance(value, dict) else [("", value)]
        for key, item in items:
            label = f"{name}/{key}" if key != "" else name
            tensor = torch.as_tensor(item).detach().to("cpu", torch.float64)
            if tensor.ndim == 0:
                out[label] = float(tensor)
            else:
                out.update({f"{label}/{i}": float(v) for i, v in enumerate(tensor.flatten().tolist())})
    return out


def unsynced_notice(metrics: dict[str, MetricSpec], world_size: int) -> str | None:
    """A notice naming the metric objects that do not reduce over ranks themselves (None if all do)."""
    plain = [name for name, spec in metrics.items() if not spec.syncs_itself]
    if world_size <= 1 or not plain:
        return None
    return (f"metrics {', '.join(plain)}: not torchmetrics metrics, so each of the {world_size} ranks computes "
            f"them over its own evaluation rows; reduce their state in compute() for a global value")


def reset_metrics(metrics: dict[str, MetricSpec]) -> None:
    for spec in metrics.values():
        spec.metric.reset()
