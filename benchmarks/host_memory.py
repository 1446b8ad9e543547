"""A/B of hotloop's host-memory setting (``hotloop.engine.host_memory``) on the LSTM LM step.

The setting is process-wide, so the two contenders cannot share one process: each round starts
one child process per contender, alternating which goes first, and each child times the hotloop
default step (``build_step`` on the hparams set's formulation, fixed strategy) after warm-up.
Reported per contender: median ms/step over the rounds and minor page faults per step.

    HOTLOOP_RAW_ROOT=DIR PYTHONPATH=. python benchmarks/host_memory.py --config small --json FILE
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["child", "main"]

CONTENDERS = {"glibc defaults": "0", "freed memory kept": "1"}


def child(config: str, steps: int, warmup: int, strategy: str) -> dict[str, float]:
    """Time ``steps`` default steps in this process (after ``warmup``)."""
    import torch

    from hotloop.builtin import declare_builtins
    from hotloop.engine.strategy import Strategy
    from hotloop.hparams import get_hparams
    from hotloop.registry import problems
    from lstm_ladder import CONFIGS, RungRunner
    from lstm_rungs import Rung
    declare_builtins()
    hp = get_hparams(CONFIGS[config])
    problem = problems.get("ptb_lm")()
    problem.prepare()
    threads = torch.get_num_threads()
    rung = Rung("hotloop default", model_loss=True,
                strategy=Strategy.parse(strategy or None, Strategy(intra_op_threads=threads)))
    runner = RungRunner(rung, hp, problem, threads)
    runner.run(warmup)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = runner.run(steps)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"ms_per_step": 1000 * seconds / steps, "faults_per_step": faults / steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strategy", default="precision=bf16", help="Strategy overrides of the step")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.config, args.steps, args.warmup, args.strategy)))
        return 0
    import torch

    from lstm_ladder import machine_facts, machine_line
    print(f"{machine_line('host_memory.py')}; config {args.config}, strategy {args.strategy}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    command = [sys.executable, __file__, "--child", "--config", args.config, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--strategy", args.strategy]
    for rnd in range(args.rounds):
        order = list(CONTENDERS) if rnd % 2 == 0 else list(reversed(CONTENDERS))
        for name in order:
            env = {**os.environ, "HOTLOOP_KEEP_FREED_MEMORY": CONTENDERS[name]}
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {rnd + 1}: {name:18s} {runs[name][-1]['ms_per_step']:7.1f} ms/step "
                  f"{runs[name][-1]['faults_per_step']:8.0f} faults/step", flush=True)
    rows = {name: {"ms_per_step": statistics.median(r["ms_per_step"] for r in rs),
                   "faults_per_step": statistics.median(r["faults_per_step"] for r in rs), "runs": rs}
            for name, rs in runs.items()}
    ratio = rows["glibc defaults"]["ms_per_step"] / rows["freed memory kept"]["ms_per_step"]
    print(f"freed memory kept: {ratio:.3f}x the step rate of glibc's defaults (medians of {args.rounds} rounds)")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, **machine_facts(),
                                               "threads": torch.get_num_threads(), "strategy": args.strategy,
                                               "steps": args.steps, "rounds": args.rounds, "rows": rows,
                                               "speedup": ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
