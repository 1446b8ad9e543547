"""``--strategy auto`` with several processes: DDP, ZeRO-1 or FSDP, from the bytes a rank holds.

:func:`layout_bytes` counts, per rank, the parameter, gradient and optimizer-state bytes of
each layout (activations are not counted):

- ``allreduce`` (DDP): every rank holds all of them: ``P + G + O``;
- ``reduce`` (ZeRO-1): optimizer state sharded: ``P + G + O/N``;
- ``fsdp``: everything sharded, plus what is gathered at once: the root unit's parameters
  and gradients for the whole step and up to two block units' (the one running and the
  one prefetched): ``(P + G + O)/N + 2 root + 2 x 2 largest block`` (fp32, an upper bound
  under bf16).

``O`` is measured per parameter element by one step of the run's optimizer on a probe
parameter. The budget is ``Strategy.memory_budget_gb`` when set, else the device's memory
(a CUDA device's total, or the host's available memory shared by this node's ranks).
:func:`choose_layout` keeps the layouts that fit; when several do, every rank times a few
steps of each on the run's first batch and the fastest wins (DDP, then ZeRO-1, on a tie
within 3%); when none fits, FSDP (the least memory) runs. The decision and its reasons are
logged as a table, and every rank returns the same Strategy.
"""
from __future__ import annotations

import copy
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..engine.activation_ckpt import block_units
from ..engine.build import build_step
from ..engine.strategy import Strategy
from ..hparams import HParams
from ..optim import build_optimizer
from ..parallel.context import ProcessGroupContext
from ..problems.base import Problem
from .isolation import restore_rng, snapshot_rng

__all__ = ["LAYOUTS", "LayoutBytes", "LayoutChoice", "layout_bytes", "optimizer_bytes_per_element",
           "device_budget_bytes", "decide", "choose_layout"]

LAYOUTS = ("allreduce", "reduce", "fsdp")
TIE = 0.03              # a simpler layout within 3% of the fastest is kept
TIMED_STEPS = 3


@dataclass(frozen=True)
class LayoutBytes:
    """Per-rank bytes of one layout."""

    params: int
    grads: int
    optimizer: int
    gathered: int = 0           # FSDP: parameters and gradients gathered at once (root + blocks)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathered


@dataclass
class LayoutChoice:
    """The chosen layout, why, and what each layout would hold and take."""

    mode: str
    reason: str
    budget: int
    bytes: dict[str, LayoutBytes]
    ms_per_step: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        mib = 2.0 ** 20
        lines = [f"data-parallel layout (MiB per rank; budget {self.budget / mib:,.1f} MiB):",
                 "  layout     params    grads  optimizer  gathered     total  fits  ms/step  chosen"]
        for mode, b in self.bytes.items():
            ms = self.ms_per_step.get(mode)
            cells = [f"{v / mib:>{w},.1f}" for v, w in ((b.params, 8), (b.grads, 8), (b.optimizer, 10),
                                                        (b.gathered, 9), (b.total, 9))]
            lines.append(f"  {mode:<10} {' '.join(cells)}  {'yes' if b.total <= self.budget else 'no':>4}"
                         f"  {f'{ms:.1f}' if ms is not None else '-':>7}  {'<==' if mode == self.mode else ''}")
        lines.append(f"  chosen: data_parallel={self.mode} ({self.reason})")
        return "\n".join(lines)


def optimizer_bytes_per_element(hp: HParams) -> float:
    """Optimizer-state bytes per parameter element of ``hp.optimizer`` (one step on a probe)."""
    probe = nn.Parameter(torch.zeros(64))
    optimizer = build_optimizer([probe], hp, fused=False)
    probe.grad = torch.zeros_like(probe)
    optimizer.step()
    state = optimizer.state.get(probe, {})
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor) and v.numel() == probe.numel()) / probe.numel()


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def layout_bytes(model: nn.Module, hp: HParams, world_size: int) -> dict[str, LayoutBytes]:
    """What a rank holds under each of :data:`LAYOUTS` (see the module doc)."""
    params = _param_bytes(model)
    elements = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optimizer = int(optimizer_bytes_per_element(hp) * elements)
    blocks = block_units(model)
    largest = max((_param_bytes(b) for b in blocks), default=0)
    root = params - sum(_param_bytes(b) for b in blocks)
    n = max(1, world_size)
    return {"allreduce": LayoutBytes(params, params, optimizer),
            "reduce": LayoutBytes(params, params, -(-optimizer // n)),
            "fsdp": LayoutBytes(-(-params // n), -(-params // n), -(-optimizer // n),
                                gathered=2 * root + 4 * largest)}


def device_budget_bytes(device: torch.device, strategy: Strategy) -> int:
    """``strategy.memory_budget_gb`` in bytes, else the device's memory for one rank."""
    if strategy.memory_budget_gb > 0:
        return int(strategy.memory_budget_gb * 2 ** 30)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    available = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return available // max(1, ranks_here) if available else 2 ** 62


def decide(sizes: dict[str, LayoutBytes], budget: int, ms_per_step: dict[str, float]) -> tuple[str, str]:
    """``(mode, reason)`` from the sizes, the budget and the steps timed for the layouts that fit."""
    fitting = [m for m in LAYOUTS if sizes[m].total <= budget]
    if not fitting:
        return "fsdp", "no layout fits the budget; fsdp holds the least"
    if len(fitting) == 1:
        others = ", ".join(m for m in LAYOUTS if m not in fitting)
        return fitting[0], f"only {fitting[0]} fits the budget ({others} do not)"
    timed = {m: ms_per_step[m] for m in fitting if m in ms_per_step}
    if not timed:
        return fitting[0], f"{', '.join(fitting)} fit; {fitting[0]} has the fewest collectives"
    best = min(timed.values())
    mode = next(m for m in fitting if m in timed and timed[m] <= best * (1 + TIE))
    return mode, (f"{', '.join(fitting)} fit; {mode} has the fastest measured step"
                  + (" (within 3% of the fastest, fewer collectives)" if timed[mode] > best else ""))


def _time_layout(mode: str, model: nn.Module, hp: HParams, strategy: Strategy, problem: Problem,
                 device: torch.device) -> float:
    """Collective: ms per step of ``mode`` on this rank's rows of the first batch (max over ranks)."""
    work = copy.deepcopy(model).train()
    trial = strategy.replace(data_parallel=mode, backend="eager" if mode == "fsdp" else strategy.backend)
    ctx = ProcessGroupContext.for_strategy(trial)
    try:
        built = build_step(work, hp, trial, wrap=ctx.wrap)
        reader = ctx.shard_reader(problem.reader("train", hp))
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in next(iter(reader)).items()}
        state = work.initial_state(hp.batch_size // ctx.world_size, device)
        times = []
        for i in range(TIMED_STEPS + 1):
            ctx.barrier()
            start = time.perf_counter()
            built.step([batch], state)
            if i:
                times.append(time.perf_counter() - start)
        slowest = torch.tensor([statistics.median(times) * 1e3], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest[0])
    finally:
        if ctx.routed is not None:
            ctx.routed.unpatch()


def choose_layout(strategy: Strategy, *, model: nn.Module, problem: Problem, hp: HParams,
                  device: torch.device | str, dist_ctx: Any, log: Callable[[str], None] = print) -> Strategy:
    """Collective: ``strategy`` with the chosen ``data_parallel`` (every rank gets the same one)."""
    device = torch.device(device)
    sizes = layout_bytes(model, hp, dist_ctx.world_size)
    # the main rank's budget on every rank (available memory is read at different moments)
    budget = int(dist_ctx.broadcast_text(str(device_budget_bytes(device, strategy)) if dist_ctx.is_main else None))
    fitting = [m for m in LAYOUTS if sizes[m].total <= budget]
    ms: dict[str, float] = {}
    if len(fitting) > 1:
        rng = snapshot_rng()
        try:
            ms = {m: _time_layout(m, model, hp, strategy, problem, device) for m in fitting}
        finally:
            restore_rng(rng)
    mode, reason = decide(sizes, budget, ms)
    choice = LayoutChoice(mode, reason, budget, sizes, ms)
    if dist_ctx.is_main:
        log(f"autotune: {choice.table()}")
    changes: dict[str, Any] = {"data_parallel": mode}
    if mode == "fsdp" and strategy.backend != "eager":
        changes["backend"] = "eager"
        if dist_ctx.is_main:
            log(f"autotune: data_parallel=fsdp runs with backend=eager (the tuned backend was {strategy.backend})")
    return strategy.replace(**changes)
