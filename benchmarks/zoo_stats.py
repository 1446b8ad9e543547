"""Numbers for ``benchmarks/zoo.py``'s table: paired per-round speed-ups, verdicts (per row and
family-wise), the geomean, the table."""
from __future__ import annotations

import math
import statistics
from typing import Any

from hotloop.tools.hardware import HardwareInfo
from scipy.stats import t as student_t

from hotloop.tools.significance import compare_paired, t_quantile_90

__all__ = ["cpu_flags", "paired_speedup", "geomean", "verdicts", "verdict_text", "familywise", "familywise_text",
           "print_table", "round_order", "ratio_text"]


def round_order(n: int, r: int) -> list[int]:
    """Round ``r``'s order of ``n`` contenders (indices): a balanced Latin square (Williams design).

    Over every ``n`` rounds (``2n`` for odd ``n``) each contender runs once in each position and
    right after every other contender equally often, so a block's neighbour (a block that leaves
    the caches or the allocator in some state) and its place in the round fall on every contender
    alike. Reversing the order every other round does not: the cyclic order stays, and the same
    contender always runs after the same one."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:             # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    if n % 2 == 0:
        return [(i + r) % n for i in first]
    row = [(i + r // 2) % n for i in first]
    return row[::-1] if r % 2 else row


def cpu_flags(hw: HardwareInfo) -> dict[str, Any]:
    """The machine's usable instruction sets, the caps in force and fast-bf16 flags (or the GPU)."""
    return {"isa": list(hw.cpu_isa), "caps": list(hw.cpu_caps), "fast_bf16_flags": list(hw.cpu_bf16),
            "cpu_model": hw.cpu_model, **({"gpu": hw.cuda_name} if hw.device == "cuda" else {})}


def paired_speedup(reference: list[float], contender: list[float]) -> dict[str, Any]:
    """``reference`` block time / ``contender``'s, paired by round (one block each per round, so a
    round's load hits both): the geometric mean of the per-round ratios, its two-sided 80% interval
    (each bound a one-sided 90% bound) and the verdict "faster" (the contender, with 90% confidence),
    "slower" or "tie"; "unpaired" with fewer than three rounds."""
    rounds = list(range(min(len(reference), len(contender))))
    c = compare_paired(contender[:len(rounds)], rounds, reference[:len(rounds)], rounds)
    if not c.paired:
        return {"paired": None, "interval90": None, "verdict": "unpaired", "pairs": c.pairs}
    low, high = 1 / c.upper, 1 / c.lower       # bounds of the time ratio, turned into speed-ups
    return {"paired": 1 / c.ratio, "interval90": [low, high], "verdict": _verdict(low, high), "pairs": c.pairs}


def _verdict(low: float, high: float) -> str:
    """The contender is "faster" when a speed-up's lower bound is above 1, "slower" when its upper is below."""
    return "faster" if low > 1 else "slower" if high < 1 else "tie"


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def ratio_text(paired: dict[str, Any]) -> str:
    """A paired ratio and its verdict, e.g. ``1.058x (faster)``; ``unpaired`` with too few rounds."""
    return "unpaired" if paired["paired"] is None else f"{paired['paired']:.3f}x ({paired['verdict']})"


def _interval(paired: dict[str, Any]) -> str:
    if paired["interval90"] is None:
        return "unpaired"
    low, high = paired["interval90"]
    return f"{low:.2f}-{high:.2f}x {paired['verdict']}"


def verdicts(rows: list[dict[str, Any]], key: str) -> dict[str, list[str]]:
    """Models by verdict of ``key`` (``vs_expert_paired`` or ``vs_naive_paired``)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r[key]["verdict"], []).append(r["model"])
    return out


def verdict_text(found: dict[str, list[str]]) -> str:
    """``{"faster": [a, b], "tie": [c]}`` -> ``faster: a, b; tie: c``."""
    return "; ".join(f"{v}: {', '.join(m)}" for v, m in sorted(found.items()))


def familywise(rows: list[dict[str, Any]], key: str, confidence: float = 0.9) -> dict[str, Any]:
    """The verdicts of ``key`` (a :func:`paired_speedup` per row) read as one table: each row's bound
    is widened to the one-sided level ``confidence ** (1 / m)`` for ``m`` paired rows (Sidak), so
    that when every row truly ties, some row reads "slower" with probability ``1 - confidence``
    (and likewise "faster"), where the per-row 90% bounds give ``1 - 0.9 ** m`` (52% for seven
    rows). Each row's standard error comes back from its stored 90% bound, so a saved table can
    be read again. ``lowest``: the row whose widened lower bound is the smallest."""
    paired = [r for r in rows if r[key]["paired"] is not None]
    if not paired:
        return {"confidence": confidence, "rows": 0, "one_sided_level": None, "verdicts": {}, "bounds": {},
                "lowest": None}
    level = confidence ** (1 / len(paired))
    bounds: dict[str, list[float]] = {}
    found: dict[str, list[str]] = {}
    for r in paired:
        p, df = r[key]["paired"], r[key]["pairs"] - 1
        log_se = math.log(p / r[key]["interval90"][0]) / t_quantile_90(df)    # 90% bound = p * exp(-t90 * se)
        half = float(student_t.ppf(level, df)) * log_se
        low, high = p * math.exp(-half), p * math.exp(half)
        bounds[r["model"]] = [low, high]
        found.setdefault(_verdict(low, high), []).append(r["model"])
    lowest = min(bounds, key=lambda m: bounds[m][0])
    return {"confidence": confidence, "rows": len(paired), "one_sided_level": level, "verdicts": found,
            "bounds": bounds, "lowest": [lowest, bounds[lowest][0]]}


def familywise_text(family: dict[str, Any], against: str) -> str:
    """One line: the family-wise verdicts and the lowest widened bound."""
    if not family["rows"]:
        return f"family-wise vs {against}: no paired rows"
    model, low = family["lowest"]
    return (f"family-wise vs {against} ({family['rows']} rows, each bound one-sided "
            f"{family['one_sided_level']:.2%}): {verdict_text(family['verdicts'])}; every row >= {low:.3f}x ({model} lowest) "
            f"with {family['confidence']:.0%} confidence")


def print_table(rows: list[dict[str, Any]], compiled: bool) -> None:
    """The naive, expert (and compiled) and hotloop columns, samples/s, with hotloop's ratios."""
    head = f"{'model':18s} {'naive/s':>9s} {'expert/s':>9s} " + (f"{'compiled/s':>10s} " if compiled else "")
    print(head + f"{'hotloop/s':>9s} {'vs naive':>9s} {'vs expert':>9s}" + (f" {'vs comp.':>9s}" if compiled else "")
          + f" {'vs expert, 80% interval':>24s}  last-block loss naive / expert / hotloop")
    for r in rows:
        line = f"{r['model']:18s} {r['plain_samples_per_s']:9.2f} {r['expert_samples_per_s']:9.2f} "
        has = "expert_compiled_samples_per_s" in r
        if compiled:
            line += f"{r['expert_compiled_samples_per_s']:10.2f} " if has else f"{'-':>10s} "
        line += f"{r['hotloop_samples_per_s']:9.2f} {r['speedup_vs_naive']:8.2f}x {r['speedup_vs_expert']:8.2f}x"
        if compiled:
            line += f" {r['speedup_vs_expert_compiled']:8.2f}x" if has else f" {'-':>9s}"
        losses = f"{r['plain_loss']:.4f} / {r['expert_loss']:.4f} / {r['hotloop_loss']:.4f}"
        control = (f"  control {_interval(r['control_paired'])}, loss moved {r['control_loss_rel_diff']:.1%}"
                   if "control_paired" in r else "")
        print(line + f" {_interval(r['vs_expert_paired']):>24s}  {losses}{control}")
