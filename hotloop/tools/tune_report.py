"""The result of one autotune run and its table: candidate -> throughput -> parity -> chosen."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.strategy import Strategy
from .hardware import HardwareInfo
from .model_facts import ModelFacts
from .proposals import Proposal, ReaderFacts
from .trials import Trial

__all__ = ["TuneReport", "strategy_diff"]


def strategy_diff(strategy: Strategy, base: Strategy) -> str:
    """``"k=v, ..."`` of the fields where ``strategy`` differs from ``base``."""
    return ", ".join(f"{k}={v}" for k, v in strategy.changes_from(base).items()) or "(same)"


@dataclass
class TuneReport:
    strategy: Strategy                      # the choice (timed winner + input-pipeline rules)
    chosen: str                             # label of the timed winner
    cache: str                              # "hit <path>" | "miss" | "disabled"
    hardware: HardwareInfo
    baseline: Strategy
    trials: list[Trial] = field(default_factory=list)
    pipeline: list[Proposal] = field(default_factory=list)   # untimed data-feeding proposals applied
    facts: ModelFacts | None = None
    reader: ReaderFacts | None = None
    budget_seconds: float = 0.0
    tune_seconds: float = 0.0
    step_calls: int = 0                     # timed + parity steps run by the trials
    notes: list[str] = field(default_factory=list)
    cached_rows: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per candidate (also what the cache stores)."""
        if not self.trials:
            return list(self.cached_rows)
        base = next((t for t in self.trials if t.label == "eager"), None)
        base_ms = base.median * 1e3 if base and base.measured else float("nan")
        rows = []
        for t in self.trials:
            ms = t.median * 1e3 if t.measured else None
            rows.append({"candidate": t.label, "changes": strategy_diff(t.strategy, self.baseline),
                         "rule": t.rule, "ms_per_step": ms,
                         "steps_per_s": 1e3 / ms if ms else None,
                         "vs_eager": base_ms / ms if ms else None,
                         "measured_steps": len(t.step_times), "status": t.status,
                         "parity": t.parity or "-", "vs_eager_paired": t.comparison or "-",
                         "chosen": t.label == self.chosen})
        for p in self.pipeline:
            rows.append({"candidate": p.label, "changes": ", ".join(f"{k}={v}" for k, v in p.changes.items()),
                         "rule": p.rule, "ms_per_step": None, "steps_per_s": None, "vs_eager": None,
                         "measured_steps": 0, "status": "applied by rule (input pipeline, not timed)",
                         "parity": "n/a", "vs_eager_paired": "-", "chosen": True})
        return rows

    def table(self) -> str:
        """Plain-text table for the terminal and the docs."""
        header = ("candidate", "ms/step", "steps/s", "x eager", "paired time ratio", "parity", "chosen", "status")
        lines = [header]
        for r in self.rows():
            ms = r.get("ms_per_step")
            lines.append((str(r["candidate"]), f"{ms:.2f}" if ms else "-",
                          f"{r['steps_per_s']:.1f}" if r.get("steps_per_s") else "-",
                          f"{r['vs_eager']:.3f}" if r.get("vs_eager") else "-",
                          str(r.get("vs_eager_paired", "-")), str(r["parity"]), "<==" if r["chosen"] else "", str(r["status"])[:60]))
        widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
        text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
        text.insert(1, "  ".join("-" * w for w in widths))
        rules = [f"  {r['candidate']}: {r['rule']}  [{r['changes']}]" for r in self.rows()]
        return "\n".join(text + ["rules:"] + rules)

    def summary(self) -> str:
        lines = [f"hardware: {self.hardware.describe()}"]
        if self.facts is not None:
            lines.append(f"model: {self.facts.summary()}")
        if self.reader is not None:
            lines.append(f"reader: {self.reader.seconds_per_batch * 1e3:.2f} ms/batch on the "
                         f"training thread")
        lines.append(f"budget: {self.budget_seconds:.1f} s; tuning took {self.tune_seconds:.1f} s "
                     f"({self.step_calls} trial steps); cache: {self.cache}")
        lines += [f"note: {n}" for n in self.notes]
        lines.append(self.table())
        lines.append(f"chosen: {self.chosen} -> {strategy_diff(self.strategy, Strategy())} "
                     f"(differences from Strategy())")
        return "\n".join(lines)
