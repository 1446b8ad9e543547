"""Each Strategy knob side by side against eager, on the registered models.

    PYTHONPATH=. nice -n 10 python benchmarks/strategies.py --model transformer [--json out.json]
    PYTHONPATH=. python benchmarks/strategies.py --model bert --only eager --bits16   # dropout masks

Every contender trains its own copy of the same model (same seed) on the same
batches. After a warm-up (captures happen there), the contenders run
*interleaved*, one step each per round, so background load hits them alike;
the per-contender median step time is compared with the eager median.
``--model`` also accepts the synthetic executor probes ``branches_large`` (4
independent 2-layer MLP branches of 1024-wide matmuls) and ``branches_small``
(the same graph at width 32: ops of a few microseconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch
from torch import nn

import hotloop  # noqa: F401 - declares registry names
from hotloop.engine import Strategy, build_step
from hotloop.hparams import HParams
from hotloop.testing import MissingCaseError, model_case
from hotloop.engine.parity import ParityCase
from hotloop.models.base import LossOutput

__all__ = ["CONTENDERS", "main", "run_benchmark"]

CONTENDERS: dict[str, Strategy] = {
    "eager": Strategy(fused_optimizer=False),
    "eager+fused_opt": Strategy(fused_optimizer=True),
    "eager+bf16": Strategy(fused_optimizer=True, precision="bf16"),
    "graph": Strategy(backend="graph", fused_optimizer=True),
    "graph+passes": Strategy(backend="graph", graph_passes=True, fused_optimizer=True),
    "graph+passes+inplace": Strategy(backend="graph", graph_passes=True, inplace=True, fused_optimizer=True),
    "graph+passes+fast_math": Strategy(backend="graph", graph_passes=True, fast_math=True, fused_optimizer=True),
    "graph+passes+parallel": Strategy(backend="graph", graph_passes=True, executor="parallel",
                                      fused_optimizer=True),
}
INDUCTOR = Strategy(backend="inductor", fused_optimizer=True)
#: ``--bits16``: eager with every dropout mask from 16-bit draws (models whose dropout drops only)
BITS16 = Strategy(fused_optimizer=False, dropout_masks="bits16")


class Branches(nn.Module):
    """``k`` independent Linear-tanh-Linear branches of width ``h`` summed: a wide, shallow graph."""

    def __init__(self, k: int, h: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Linear(h, h), nn.Tanh(), nn.Linear(h, h))
                                      for _ in range(k))

    def loss(self, batch: dict, state: Any = None) -> LossOutput:
        y = sum(b(batch["inputs"]) for b in self.branches)
        loss = (y - batch["targets"]).pow(2).mean()
        return LossOutput(loss, {"loss_sum": loss.detach()}, state)


def branches_case(width: int, rows: int) -> Callable[[], ParityCase]:
    g = torch.Generator().manual_seed(0)
    batches = [{"inputs": torch.randn(rows, width, generator=g), "targets": torch.randn(rows, width, generator=g)}
               for _ in range(4)]

    def build() -> ParityCase:
        torch.manual_seed(0)
        return ParityCase(Branches(4, width), lambda p, fused: torch.optim.SGD(p, lr=1e-3, foreach=fused),
                          batches)
    return build


def _case(model: str, steps: int) -> Callable[[], ParityCase]:
    if model == "branches_large":
        return branches_case(1024, 256)
    if model == "branches_small":
        return branches_case(32, 16)
    return model_case(model, "bench", steps=steps)


def run_steps_builder(case: ParityCase, strategy: Strategy):
    """The Trainer's step for ``case`` (hparams or an optimizer factory) under ``strategy``."""
    hp = case.optimizer if isinstance(case.optimizer, HParams) else HParams()
    factory = None if isinstance(case.optimizer, HParams) else case.optimizer
    return build_step(case.model, hp, strategy, loss_fn=case.loss_fn, optimizer=factory,
                      max_grad_norm=case.max_grad_norm).step


def run_benchmark(model: str, contenders: dict[str, Strategy], rounds: int, warmup: int) -> list[dict]:
    build = _case(model, steps=4)
    runners = {}
    for label, strategy in contenders.items():
        case = build()
        step = run_steps_builder(case, strategy)
        runners[label] = [step, case, case.state]
    batches = [b if isinstance(b, list) else [b] for b in build().batches]
    times: dict[str, list[float]] = {label: [] for label in runners}
    for r in range(warmup + rounds):
        for label, runner in runners.items():
            step, case, state = runner
            micro = batches[r % len(batches)]
            start = time.perf_counter()
            result = step(micro, state)
            float(result.loss)                          # include the step's tail in the timing
            elapsed = time.perf_counter() - start
            runner[2] = result.state
            if r >= warmup:
                times[label].append(elapsed)
    base, base_min = statistics.median(times["eager"]), min(times["eager"])
    rows = []
    for label, ts in times.items():
        step = runners[label][0]
        med = statistics.median(ts)
        rows.append({"model": model, "strategy": label, "median_ms": round(med * 1e3, 3),
                     "min_ms": round(min(ts) * 1e3, 3), "speedup_vs_eager": round(base / med, 3),
                     "speedup_of_min": round(base_min / min(ts), 3),
                     "fallback": getattr(step, "fallback_reason", None)})
    return rows


def main(argv: list[str] | None = None) -> int:
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/strategies.py"), flush=True)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, help="repeatable")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    p.add_argument("--inductor", action="store_true", help="also torch.compile (slow to compile on CPU)")
    p.add_argument("--bits16", action="store_true", help="also eager with dropout_masks=bits16 "
                   "(models with dropout only)")
    p.add_argument("--only", default="", help="comma-separated contender labels (eager always runs)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    contenders = dict(CONTENDERS)
    if args.only:
        keep = set(args.only.split(",")) | {"eager"}
        contenders = {k: v for k, v in contenders.items() if k in keep}
    if args.inductor:
        contenders["inductor"] = INDUCTOR
    if args.bits16:
        contenders["eager+bits16"] = BITS16
    rows: list[dict] = []
    for model in args.model:
        try:
            rows += run_benchmark(model, contenders, args.rounds, args.warmup)
        except MissingCaseError as exc:
            print(f"skip {model}: {exc}", file=sys.stderr)
    threads = torch.get_num_threads()
    print(f"intra-op threads: {threads}; parallel executor workers: 2; rounds: {args.rounds} (interleaved, medians)")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    print(f"{'model':16} {'strategy':26} {'median ms':>10} {'vs eager':>9} {'min ms':>9} {'min vs':>7}  fallback")
    for row in rows:
        print(f"{row['model']:16} {row['strategy']:26} {row['median_ms']:10.2f} {row['speedup_vs_eager']:8.2f}x"
              f" {row['min_ms']:9.2f} {row['speedup_of_min']:6.2f}x  {(row['fallback'] or '')[:60]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": threads, "rounds": args.rounds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
