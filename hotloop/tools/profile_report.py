"""The speed doctor's report: sections as text, a self-contained HTML page, or a PNG chart."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.strategy import Strategy
from .model_facts import ModelFacts

__all__ = ["PHASES", "SPLIT", "QueueHealth", "Recommendation", "ProfileReport", "SECTIONS"]

#: phases timed inside the real step ("forward_backward": a captured graph runs both at once)
PHASES = ("data_wait", "forward", "backward", "forward_backward", "optimizer", "sync")
SPLIT = ("data_wait", "host_overhead", "forward", "backward", "forward_backward", "optimizer", "step_other",
         "sync")
SECTIONS = ("time split per step", "input queue", "top ops", "host-device syncs", "memory", "MFU",
            "recommendations")


@dataclass(frozen=True)
class QueueHealth:
    capacity: int                    # Strategy.prefetch (0 = synchronous)
    median_wait_s: float             # per batch, on the training thread
    max_wait_s: float
    starved_fraction: float          # share of batches that waited > 0.1 ms
    mean_depth: float | None         # queued batches seen at each get (None: no queue)
    note: str = ""


@dataclass(frozen=True)
class Recommendation:
    setting: str                     # "Strategy.precision" / "hparams.batch_size" / "reader: ..."
    value: str                       # the suggested value
    reason: str
    expected_gain: float             # estimated fraction of step time saved (upper bound)

    def line(self) -> str:
        return (f"set {self.setting}={self.value}: {self.reason} "
                f"(expected: up to {self.expected_gain:.0%} less step time)")


@dataclass
class ProfileReport:
    model: str
    strategy: Strategy
    device: str
    threads: int
    hardware: str
    steps: int
    step_seconds: float
    phases: dict[str, float]         # seconds per step: PHASES plus step_other (step call outside phases)
    host_shares: dict[str, float]    # phase -> fraction of it outside any op (profiled pass)
    queue: QueueHealth
    top_ops: list[tuple[str, float, float]]    # (op, self ms per step, calls per step)
    syncs_per_step: dict[str, float]            # phase -> host-device syncs per step
    peak_memory: tuple[float, str]   # (bytes, how measured)
    flops_per_step: float
    peak_flops: float                # measured GEMM peak for the strategy's precision
    facts: ModelFacts | None = None
    recommendations: list[Recommendation] = field(default_factory=list)

    @property
    def split(self) -> dict[str, float]:
        """Seconds per step: data wait, host overhead (Python/dispatch inside phases), compute phases, sync."""
        out = {"data_wait": self.phases["data_wait"], "host_overhead": 0.0}
        for phase in ("forward", "backward", "forward_backward", "optimizer"):
            own = self.phases.get(phase, 0.0)
            host = own * self.host_shares.get(phase, 0.0)
            out["host_overhead"] += host
            out[phase] = own - host
        out["step_other"] = self.phases.get("step_other", 0.0)
        out["sync"] = self.phases["sync"]
        return out

    @property
    def mfu(self) -> float:
        return self.flops_per_step / self.step_seconds / self.peak_flops if self.step_seconds and self.peak_flops else 0.0

    def sections(self) -> dict[str, list[str]]:
        split, total = self.split, self.step_seconds or 1e-12
        time_lines = [f"{name:<14} {sec * 1e3:9.3f} ms  {sec / total:6.1%}" for name, sec in split.items()]
        time_lines.append(f"{'step':<14} {self.step_seconds * 1e3:9.3f} ms  ({1 / total:.1f} steps/s)")
        q = self.queue
        depth = f"{q.mean_depth:.2f}/{q.capacity}" if q.mean_depth is not None else "n/a"
        queue = [f"prefetch capacity {q.capacity}; mean queue depth at get {depth}",
                 f"wait per batch: median {q.median_wait_s * 1e3:.3f} ms, max {q.max_wait_s * 1e3:.3f} ms; "
                 f"{q.starved_fraction:.0%} of gets waited > 0.1 ms"] + ([q.note] if q.note else [])
        ops = [f"{name[:48]:<48} {ms:9.3f} ms/step  {calls:7.1f} calls/step" for name, ms, calls in self.top_ops]
        mem_bytes, how = self.peak_memory
        mfu = [f"{self.flops_per_step / 1e9:.3f} GFLOP/step (torch FlopCounterMode, fwd+bwd) / "
               f"{self.step_seconds * 1e3:.2f} ms = {self.flops_per_step / total / 1e9:.2f} GFLOP/s",
               f"measured {self.strategy.precision} GEMM peak {self.peak_flops / 1e9:.1f} GFLOP/s -> "
               f"MFU {self.mfu:.1%}"]
        if self.mfu > 1:
            mfu.append("MFU > 100%: the cached GEMM peak was measured while the cores were busy; delete "
                       "gemm_peak_*.json in the autotune cache dir to re-measure")
        recs = [r.line() for r in self.recommendations] or ["nothing obvious: the step is compute-bound"]
        return {"time split per step": time_lines, "input queue": queue, "top ops": ops,
                "host-device syncs": self._sync_lines(),
                "memory": [f"peak {mem_bytes / 2 ** 20:.1f} MiB ({how})"], "MFU": mfu,
                "recommendations": recs}

    def _sync_lines(self) -> list[str]:
        total = sum(self.syncs_per_step.values())
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(self.syncs_per_step.items())) or "none"
        lines = [f"{total:.2f} per step ({parts}); the trainer itself needs "
                 f"{1 / self.strategy.sync_every:.2f} (sync_every={self.strategy.sync_every})"]
        if self.syncs_per_step.get("optimizer", 0) and self.device == "cpu":
            lines.append("optimizer: host reads in the update (the clip coefficient, a per-tensor "
                         "optimizer's step counters) are cheap on CPU; no device to wait for")
        return lines

    def text(self) -> str:
        head = [f"speed doctor: {self.model} on {self.device} ({self.threads} threads), {self.steps} steps",
                f"hardware: {self.hardware}"]
        body = []
        for name, lines in self.sections().items():
            body += ["", f"== {name} =="] + lines
        return "\n".join(head + body)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "threads": self.threads,
                "step_ms": self.step_seconds * 1e3, "split_ms": {k: v * 1e3 for k, v in self.split.items()},
                "syncs_per_step": dict(self.syncs_per_step), "peak_memory_bytes": self.peak_memory[0],
                "mfu": self.mfu, "recommendations": [r.line() for r in self.recommendations]}

    def write_html(self, path: str | Path) -> Path:
        """A single self-contained HTML file (inline CSS bars, no scripts)."""
        colors = ["#e15759", "#f28e2b", "#4e79a7", "#59a14f", "#b07aa1", "#9c755f"]
        total = self.step_seconds or 1e-12
        bars = "".join(
            f'<div style="width:{100 * sec / total:.2f}%;background:{c}" title="{name}"></div>'
            for (name, sec), c in zip(self.split.items(), colors))
        legend = " ".join(f'<span style="color:{c}">&#9632; {name}</span>' for name, c in zip(SPLIT, colors))
        parts = [f"<h1>hotloop speed doctor</h1><p>{html.escape(self.model)} on {html.escape(self.device)}, "
                 f"{self.threads} threads; {html.escape(self.hardware)}</p>",
                 f'<div class="bar">{bars}</div><p>{legend}</p>']
        for name, lines in self.sections().items():
            items = "".join(f"<li><code>{html.escape(line)}</code></li>" for line in lines)
            parts.append(f"<h2>{html.escape(name)}</h2><ul>{items}</ul>")
        page = ("<!doctype html><html><head><meta charset='utf-8'><title>hotloop profile</title><style>"
                "body{font-family:sans-serif;max-width:60em;margin:2em auto}"
                ".bar{display:flex;height:2em;border:1px solid #333}code{white-space:pre}"
                "</style></head><body>" + "".join(parts) + "</body></html>")
        path = Path(path)
        path.write_text(page, encoding="utf-8")
        return path

    def write_png(self, path: str | Path) -> Path:
        """A bar chart of the time split (needs matplotlib)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            from ..errors import UserError
            raise UserError("--png needs matplotlib: pip install 'hotloop[plot]'; or use --html") from None
        fig, ax = plt.subplots(figsize=(7, 3))
        names, values = zip(*[(k, v * 1e3) for k, v in self.split.items()])
        ax.barh(names, values)
        ax.set_xlabel("ms per step")
        ax.set_title(f"{self.model.rsplit('.', 1)[-1]}: {self.step_seconds * 1e3:.2f} ms/step")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return Path(path)
