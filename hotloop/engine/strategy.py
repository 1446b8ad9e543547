"""`Strategy`: one typed, validated object holding every speed knob.

Paddle split these over BuildStrategy, ExecutionStrategy and FLAGS; here they
are one frozen dataclass. ``validate(device)`` rejects fields that do not
apply to the hardware and incompatible combinations.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..hparams import HParamsError, apply_overrides

__all__ = ["Strategy", "StrategyError", "parse_strategy"]


class StrategyError(ValueError):
    """A Strategy field that is invalid, or does not apply to this hardware."""


@dataclass(frozen=True)
class Strategy:
    # build options
    graph_passes: bool = False          # run hotloop's rewrite passes on the captured graph
    fused_optimizer: bool = True        # multi-tensor (foreach / fused) optimizer update
    inplace: bool = False               # inplace activations where safe
    backend: str = "eager"              # "eager" | "graph" (own executor) | "inductor"
    cuda_graphs: bool = False
    # execution options
    intra_op_threads: int = 0           # 0 = leave torch's default
    inter_op_threads: int = 0
    executor: str = "serial"            # "serial" | "parallel" (graph backend only)
    sync_every: int = 50                # host-sync / metric-read cadence in steps
    # precision
    precision: str = "fp32"             # "fp32" | "bf16" | "fp16"
    # device flags
    cudnn_benchmark: bool = False
    tf32: bool = False
    onednn: bool = True
    channels_last: bool = False
    # input pipeline
    prefetch: int = 2                   # async prefetch queue capacity; 0 = synchronous
    num_workers: int = 0
    speed_test: bool = False            # serve one prepared batch repeatedly (compute-only)
    # data parallel
    data_parallel: str = "none"         # "none" | "allreduce" | "reduce"
    bucket_mb: float = 25.0

    def replace(self, **changes: Any) -> "Strategy":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, device: torch.device | str = "cpu") -> "Strategy":
        """Raise :class:`StrategyError` for invalid or inapplicable settings; return self."""
        device = torch.device(device)
        choices = {"backend": ("eager", "graph", "inductor"), "executor": ("serial", "parallel"),
                   "precision": ("fp32", "bf16", "fp16"),
                   "data_parallel": ("none", "allreduce", "reduce")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise StrategyError(f"strategy {name}={getattr(self, name)!r}; choose one of {list(allowed)}")
        for name in ("intra_op_threads", "inter_op_threads", "prefetch", "num_workers"):
            if getattr(self, name) < 0:
                raise StrategyError(f"strategy {name} must be >= 0")
        if self.sync_every < 1:
            raise StrategyError("strategy sync_every must be >= 1")
        if self.bucket_mb <= 0:
            raise StrategyError("strategy bucket_mb must be > 0")
        if device.type != "cuda":
            for name in ("cuda_graphs", "cudnn_benchmark", "tf32"):
                if getattr(self, name):
                    raise StrategyError(f"strategy {name}=True needs a CUDA device (running on {device.type})")
            if self.precision == "fp16":
                raise StrategyError("strategy precision=fp16 needs CUDA (a loss-scaled fp16 step is "
                                    "slower than fp32 on CPU); use precision=bf16")
        if self.executor == "parallel" and self.backend != "graph":
            raise StrategyError("strategy executor=parallel runs captured graphs: set backend=graph")
        if self.cuda_graphs and self.backend == "eager" and self.graph_passes:
            raise StrategyError("strategy cuda_graphs with graph_passes needs backend=graph or inductor")
        return self


def parse_strategy(base: Strategy | None = None, overrides: str | None = None) -> Strategy:
    """Apply ``"k=v,..."`` overrides to a Strategy (same syntax as hparams overrides)."""
    try:
        return apply_overrides(base or Strategy(), overrides)  # type: ignore[type-var]
    except HParamsError as exc:
        raise StrategyError(str(exc).replace("hparam", "strategy field")) from None
