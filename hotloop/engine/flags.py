"""Device flags (Paddle's FLAGS): threads, cuDNN, TF32, oneDNN, matmul precision.

``apply_device_flags(strategy, device)`` validates the strategy for the device,
sets every process-wide flag the strategy controls and returns a report of
what it set (``name -> (before, after)``). It is idempotent: calling it again
with the same strategy changes nothing and reports every flag unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .strategy import Strategy

__all__ = ["FlagReport", "apply_device_flags", "current_flags"]


@dataclass
class FlagReport:
    """``changed``: flags whose value this call changed; ``unchanged``: already right;
    ``notes``: flags that could not be set, with the reason."""

    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    unchanged: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{k}: {a} -> {b}" for k, (a, b) in self.changed.items()]
        out += [f"{k}: {v} (unchanged)" for k, v in self.unchanged.items()]
        return out + [f"note: {n}" for n in self.notes]


def current_flags() -> dict[str, Any]:
    """The process-wide flags ``apply_device_flags`` manages, as they are now."""
    flags: dict[str, Any] = {
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "mkldnn.enabled": torch.backends.mkldnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if torch.backends.cudnn.is_available():
        flags["cudnn.benchmark"] = torch.backends.cudnn.benchmark
        flags["cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
    return flags


def _set(report: FlagReport, name: str, before: Any, after: Any, setter: Any) -> None:
    if before == after:
        report.unchanged[name] = after
        return
    try:
        setter(after)
    except RuntimeError as exc:  # e.g. inter-op pool already started
        report.notes.append(f"{name} stays {before}: {str(exc).splitlines()[0]}")
        return
    report.changed[name] = (before, after)


def apply_device_flags(strategy: Strategy, device: torch.device | str = "cpu") -> FlagReport:
    """Validate ``strategy`` for ``device`` and set its process-wide flags; report what changed."""
    device = torch.device(device)
    strategy.validate(device)
    report = FlagReport()
    now = current_flags()
    if strategy.intra_op_threads:
        _set(report, "intra_op_threads", now["intra_op_threads"], strategy.intra_op_threads,
             torch.set_num_threads)
    if strategy.inter_op_threads:
        _set(report, "inter_op_threads", now["inter_op_threads"], strategy.inter_op_threads,
             torch.set_num_interop_threads)
    if device.type == "cpu":
        _set(report, "mkldnn.enabled", now["mkldnn.enabled"], strategy.onednn,
             lambda v: setattr(torch.backends.mkldnn, "enabled", v))
    if device.type == "cuda":
        precision = "high" if strategy.tf32 else "highest"
        _set(report, "float32_matmul_precision", now["float32_matmul_precision"], precision,
             torch.set_float32_matmul_precision)
        if "cudnn.benchmark" in now:
            _set(report, "cudnn.benchmark", now["cudnn.benchmark"], strategy.cudnn_benchmark,
                 lambda v: setattr(torch.backends.cudnn, "benchmark", v))
            _set(report, "cudnn.allow_tf32", now["cudnn.allow_tf32"], strategy.tf32,
                 lambda v: setattr(torch.backends.cudnn, "allow_tf32", v))
    return report
