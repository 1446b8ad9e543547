"""The speed doctor: where does a training step's time go, and what to change.

``profile_training`` builds the step the Trainer builds
(:func:`hotloop.engine.step.build_step`) on a copy of the model, feeds it through
the Trainer's feeding path (:class:`hotloop.train.feeding.DataFeeder`: prefetch,
workers and speed-test mode as the Strategy says) and runs it twice:

1. a *timed* pass (no profiler): each whole iteration is timed (data wait, the
   step call, the trainer's host read every ``sync_every`` steps), and a phase
   hook inside the real step times its forward, backward (or captured
   forward+backward) and optimizer phases; the step time not inside a phase is
   the step's own overhead;
2. a *profiled* pass (torch.profiler, the same hook annotating the phases): top
   ops (``key_averages``), host-device syncs per step (``aten::_local_scalar_dense``,
   CUDA synchronize calls) and the host-overhead share of each phase.

It adds peak memory, MFU against this machine's measured GEMM peak and
recommendations (:mod:`hotloop.tools.profile_advice`). The caller's model,
weights and RNG streams are untouched.
"""
from __future__ import annotations

import contextlib
import copy
import resource
import statistics
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ..engine.build import build_step
from ..engine.strategy import Strategy
from ..hparams import HParams
from ..problems.base import Problem, open_reader
from ..train.feeding import DataFeeder
from .hardware import detect_hardware, gemm_peak
from .isolation import applied_strategy, preserved_process_state
from .model_facts import analyze_model, initial_state_for
from .profile_advice import recommend
from .profile_report import PHASES, ProfileReport, QueueHealth

__all__ = ["profile_training", "ProfileReport"]

_SYNC_EVENTS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                "cudaEventSynchronize")


class _Feed:
    """The Trainer's feeder over the train split, epoch after epoch, recording each wait."""

    def __init__(self, problem: Problem, hp: HParams, strategy: Strategy, device: torch.device) -> None:
        reader = open_reader(problem, "train", hp, workers=strategy.num_workers)
        self.feeder = DataFeeder(reader, device, strategy.prefetch, speed_test=strategy.speed_test)
        self.capacity = strategy.prefetch
        self.epoch = 0
        self.feeder.start_epoch(self.epoch)
        self.waits: list[float] = []
        self.depths: list[int] = []

    def next(self, count: int) -> list[dict]:
        stats = getattr(self.feeder._get_source(), "stats", None)
        if stats is not None:
            self.depths.append(int(getattr(stats, "qsize", 0)))
        start = time.perf_counter()
        batches = self.feeder.next_step(count)
        if batches is None:                  # a short epoch: start the next one
            self.feeder.finish_epoch()
            self.epoch += 1
            self.feeder.start_epoch(self.epoch)
            batches = self.feeder.next_step(count)
        if batches is None:
            raise ValueError("the train reader yielded no batches")
        self.waits.append(time.perf_counter() - start)
        return batches

    def close(self) -> None:
        self.feeder.close()

    def health(self) -> QueueHealth:
        waits = self.waits or [0.0]
        return QueueHealth(self.capacity, statistics.median(waits), max(waits),
                           sum(w > 1e-4 for w in waits) / len(waits),
                           statistics.mean(self.depths) if self.depths else None, "")


class _PhaseTimer:
    """A phase hook for the real step: times each phase (and annotates it for the profiler)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        with record_function(f"hotloop::{name}"):
            yield
        self._sync()
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start


class _Stepper:
    """The Trainer's compiled step on a model copy, one iteration at a time, timed as a whole."""

    def __init__(self, model: nn.Module, hp: HParams, strategy: Strategy, device: torch.device) -> None:
        self.hp, self.strategy, self.device = hp, strategy, device
        self.step = build_step(model, hp, strategy).step
        self.timer = _PhaseTimer(device)
        self.step.phase = self.timer
        self.model = model
        self.state: Any = None
        self.steps = 0
        self.pending: list[torch.Tensor] = []

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def run(self, feed: _Feed) -> dict[str, float]:
        """One iteration; returns seconds per phase plus ``step`` (the whole step call)."""
        self.timer.times = {}
        t0 = self._now()
        with record_function("hotloop::data_wait"):
            batches = feed.next(max(1, self.hp.accum_steps))
        if self.state is None:
            self.state = initial_state_for(self.model, batches[0], self.device)
        t1 = self._now()
        result = self.step(batches, self.state)
        t2 = self._now()
        self.state = result.state
        self.pending.append(result.loss)
        self.steps += 1
        if self.steps % self.strategy.sync_every == 0:      # the trainer's metric read-back
            with record_function("hotloop::sync"):
                float(torch.stack(self.pending).sum())
            self.pending.clear()
        t3 = time.perf_counter()
        times = {p: self.timer.times.get(p, 0.0) for p in PHASES}
        times.update(data_wait=t1 - t0, sync=t3 - t2, step=t2 - t1)
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
        feed = _Feed(problem, hp, strategy, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            with applied_strategy(strategy, device):
                stepper = _Stepper(work, hp, strategy, device)
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
                facts = analyze_model(work, feed.next(1)[0])
        finally:
            feed.close()
    # compute phases: medians (robust to other processes); data wait and sync are periodic: means
    periodic = ("data_wait", "sync")
    phases = {p: (statistics.mean if p in periodic else statistics.median)([t[p] for t in timed])
              for p in PHASES}
    call = statistics.median([t["step"] for t in timed])          # the step call, timed as a whole
    phases["step_other"] = max(0.0, call - sum(v for p, v in phases.items() if p not in periodic))
    step_s = call + phases["data_wait"] + phases["sync"]
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
