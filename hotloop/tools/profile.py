"""The speed doctor: where does a training step's time go, and what to change.

``profile_training`` runs a copy of the model for a few steps, twice:

1. a *timed* pass (no profiler): wall time per phase — data wait (through the
   real feeding path: ``hotloop.data.prefetch`` when ``Strategy.prefetch > 0``),
   forward, backward, optimizer (clip + update + zero-grad), sync (the trainer's
   host read every ``sync_every`` steps) — medians over steps;
2. a *profiled* pass (torch.profiler): top ops (``key_averages``), host-device
   syncs per step (``aten::_local_scalar_dense``, CUDA synchronize calls), and
   the host-overhead share of each phase (phase time not spent inside any op).

It adds peak memory, MFU against this machine's measured GEMM peak and
recommendations (:mod:`hotloop.tools.profile_advice`). The caller's model,
weights and RNG streams are untouched.
"""
from __future__ import annotations

import copy
import resource
import statistics
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ..engine.step import autocast_context, clip_grad_norm, detach_state
from ..engine.strategy import Strategy
from ..hparams import HParams
from ..optim import build_optimizer, sparse_gradient_modules
from ..problems.base import Problem
from .hardware import detect_hardware, gemm_peak
from .isolation import applied_strategy, preserved_process_state
from .model_facts import analyze_model, initial_state_for
from .profile_advice import recommend
from .profile_report import PHASES, ProfileReport, QueueHealth

__all__ = ["profile_training", "ProfileReport"]

_SYNC_EVENTS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                "cudaEventSynchronize")


class _Feed:
    """Batches through the real feeding path, recording the time each ``next`` waited."""

    def __init__(self, problem: Problem, hp: HParams, strategy: Strategy, device: torch.device) -> None:
        self.problem, self.hp, self.strategy, self.device = problem, hp, strategy, device
        self.source: Any = None
        self.iterator: Iterator[Any] | None = None
        self.waits: list[float] = []
        self.depths: list[int] = []
        self.note = ""
        self._open()

    def _open(self) -> None:
        reader = self.problem.reader("train", self.hp)
        try:
            from ..data.prefetch import prefetch
        except ImportError:
            prefetch = None
            self.note = "hotloop.data.prefetch is not available: synchronous reader"
        if prefetch is not None:
            self.source = prefetch(reader, capacity=self.strategy.prefetch, device=self.device)
        else:
            self.source = reader
        self.iterator = iter(self.source)

    def next(self) -> dict:
        stats = getattr(self.source, "stats", None)
        if stats is not None:
            self.depths.append(int(getattr(stats, "qsize", 0)))
        start = time.perf_counter()
        try:
            batch = next(self.iterator)
        except StopIteration:               # a short epoch: start the next one
            self.close()
            self._open()
            batch = next(self.iterator)
        self.waits.append(time.perf_counter() - start)
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    def health(self) -> QueueHealth:
        waits = self.waits or [0.0]
        return QueueHealth(self.strategy.prefetch, statistics.median(waits), max(waits),
                           sum(w > 1e-4 for w in waits) / len(waits),
                           statistics.mean(self.depths) if self.depths else None, self.note)


class _Stepper:
    """An instrumented eager step with the same math as ``TrainStep`` (phases timed separately)."""

    def __init__(self, model: nn.Module, hp: HParams, strategy: Strategy, device: torch.device) -> None:
        self.model, self.hp, self.strategy, self.device = model, hp, strategy, device
        sparse = bool(sparse_gradient_modules(model))
        self.optimizer = build_optimizer(model.parameters(), hp, fused=strategy.fused_optimizer and not sparse,
                                         sparse=sparse)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.state: Any = None
        self.steps = 0
        self.pending: list[torch.Tensor] = []

    def _mark(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def run(self, feed: _Feed) -> dict[str, float]:
        accum = max(1, self.hp.accum_steps)
        times = dict.fromkeys(PHASES, 0.0)
        for _ in range(accum):
            t0 = self._mark()
            with record_function("hotloop::data_wait"):
                batch = feed.next()
            if self.state is None:
                self.state = initial_state_for(self.model, batch, self.device)
            t1 = self._mark()
            with record_function("hotloop::forward"), autocast_context(self.strategy.precision, self.device):
                out = self.model.loss(batch, self.state)
            loss = out.loss / accum
            t2 = self._mark()
            with record_function("hotloop::backward"):
                loss.backward()
            t3 = self._mark()
            self.state = detach_state(out.state)
            self.pending.append(out.loss.detach())
            times["data_wait"] += t1 - t0
            times["forward"] += t2 - t1
            times["backward"] += t3 - t2
        t3 = self._mark()
        with record_function("hotloop::optimizer"):
            if self.hp.max_grad_norm > 0:
                clip_grad_norm(self.params, self.hp.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        t4 = self._mark()
        self.steps += 1
        if self.steps % self.strategy.sync_every == 0:      # the trainer's metric read-back
            with record_function("hotloop::sync"):
                float(torch.stack(self.pending).sum())
            self.pending.clear()
        t5 = time.perf_counter()
        times["optimizer"] = t4 - t3
        times["sync"] = t5 - t4
        return times


def _peak_memory(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(kib) * 1024.0, "process peak RSS (getrusage ru_maxrss; includes the interpreter)"


def _host_shares(prof: Any) -> dict[str, float]:
    """Per phase: fraction of its wall time not covered by the ops directly inside it."""
    wall: dict[str, float] = {}
    inside: dict[str, float] = {}
    for event in prof.events():
        if not event.name.startswith("hotloop::"):
            continue
        phase = event.name.split("::", 1)[1]
        wall[phase] = wall.get(phase, 0.0) + event.time_range.elapsed_us()
        inside[phase] = inside.get(phase, 0.0) + sum(c.time_range.elapsed_us() for c in event.cpu_children)
    return {p: max(0.0, 1.0 - inside[p] / wall[p]) for p in wall if wall[p] > 0}


def _syncs_by_phase(prof: Any, steps: int) -> dict[str, float]:
    """Host-device sync events per step, attributed to the phase (annotation) they ran in."""
    counts: dict[str, float] = {}
    for event in prof.events():
        if event.name not in _SYNC_EVENTS:
            continue
        parent, phase = event.cpu_parent, "other"
        while parent is not None:
            if parent.name.startswith("hotloop::"):
                phase = parent.name.split("::", 1)[1]
                break
            parent = parent.cpu_parent
        counts[phase] = counts.get(phase, 0.0) + 1.0 / steps
    return counts


def profile_training(model: nn.Module, problem: Problem, hp: HParams, strategy: Strategy | None = None,
                     device: torch.device | str = "cpu", *, steps: int = 20, warmup: int = 3,
                     profiled_steps: int = 5, top: int = 12,
                     log: Callable[[str], None] = lambda line: None) -> ProfileReport:
    """Profile ``steps`` training steps of a copy of ``model`` under ``strategy`` and diagnose them."""
    device = torch.device(device)
    strategy = (strategy or Strategy()).validate(device)
    if steps < 1 or warmup < 0 or profiled_steps < 1:
        raise ValueError("profile needs steps >= 1, warmup >= 0 and profiled_steps >= 1")
    hw = detect_hardware(device)
    with preserved_process_state():
        work = copy.deepcopy(model).to(device).train()
        if strategy.channels_last:
            work = work.to(memory_format=torch.channels_last)
        stepper = _Stepper(work, hp, strategy, device)
        feed = _Feed(problem, hp, strategy, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            with applied_strategy(strategy, device):
                threads = torch.get_num_threads()
                peak = gemm_peak(hw)            # at the strategy's thread count
                log(f"profile: warm-up {warmup} + {steps} timed + {profiled_steps} profiled steps")
                for _ in range(warmup):
                    stepper.run(feed)
                feed.waits.clear()
                feed.depths.clear()
                timed = [stepper.run(feed) for _ in range(steps)]
                health = feed.health()
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=activities) as prof:
                    for _ in range(profiled_steps):
                        stepper.run(feed)
                facts = analyze_model(work, feed.next())
        finally:
            feed.close()
    # compute phases: medians (robust to other processes); data wait and sync are periodic: means
    phases = {p: (statistics.mean if p in ("data_wait", "sync") else statistics.median)([t[p] for t in timed])
              for p in PHASES}
    step_s = sum(phases.values())
    syncs = _syncs_by_phase(prof, profiled_steps)
    averages = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)
    top_ops = [(a.key, a.self_cpu_time_total / 1e3 / profiled_steps, a.count / profiled_steps)
               for a in averages if not a.key.startswith("hotloop::")][:top]
    flops = facts.flops_per_step * max(1, hp.accum_steps)
    peak_flops = peak.for_precision(strategy.precision)
    report = ProfileReport(
        model=facts.model_class, strategy=strategy, device=str(device), threads=threads,
        hardware=hw.describe(), steps=steps, step_seconds=step_s, phases=phases,
        host_shares=_host_shares(prof), queue=health, top_ops=top_ops, syncs_per_step=syncs,
        peak_memory=_peak_memory(device), flops_per_step=flops, peak_flops=peak_flops, facts=facts)
    report.recommendations = recommend(report, hw, peak)
    return report
