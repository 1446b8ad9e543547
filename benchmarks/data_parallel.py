"""Data-parallel throughput on one machine: 1 process x 2 threads vs 2 processes x 1 thread.

    PYTHONPATH=. python benchmarks/data_parallel.py [--json FILE] [--rounds 5]
    PYTHONPATH=. python benchmarks/data_parallel.py --fsdp-memory --json FILE [--hparams bert_base]

One 2-rank gloo job (launched with ``torch.distributed.run``) runs all
contenders interleaved, round by round after warm-up, and reports medians:

- ``single_2t``: rank 0 alone, 2 intra-op threads, the full batch (rank 1
  waits in a barrier, which sleeps in a socket read; its CPU time is reported);
- ``single_1t``: the same with 1 thread (the scaling baseline);
- ``allreduce``: both ranks, 1 thread each, half the batch each, DDP buckets;
- ``reduce``: the same with ZeRO-1 (DDP plus ``ZeroRedundancyOptimizer``);
- ``fsdp``: the same with FSDP2 (parameters, gradients and optimizer state sharded).

Workloads: the LSTM LM (``lstm_lm_small`` on ``ptb_lm``) and ``conv_net_base``
on ``image_synthetic``. Also reported: optimizer-state bytes held per rank.

``--fsdp-memory`` measures instead the per-rank bytes of parameters + gradients + optimizer
state of BERT under FSDP and DDP at 2 and 4 ranks, and both loss curves
(:mod:`fsdp_memory`); it writes ``{"memory_ratio": {"2": r2, "4": r4}, ...}``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "Runner", "workloads", "table"]

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# name -> (runner, intra-op threads per process)
CONTENDERS = {"single_2t": ("single", 2), "single_1t": ("single", 1),
              "allreduce": ("allreduce", 1), "reduce": ("reduce", 1), "fsdp": ("fsdp", 1)}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Runner:
    """One contender's model, optimizer, step and endless batch stream."""

    def __init__(self, workload: dict[str, Any], ctx: Any) -> None:
        import torch

        from hotloop.engine.build import build_step
        from hotloop.engine.strategy import Strategy
        torch.manual_seed(0)
        hp, problem = workload["hp"], workload["problem"]
        self.spec = problem.spec(hp)
        self.model = workload["model_cls"](hp, self.spec)
        built = build_step(self.model, hp, Strategy(), wrap=ctx.wrap if ctx is not None else None)
        self.model, self.optimizer, self.step_fn = built.model, built.optimizer, built.step
        reader = problem.reader("train", hp)
        self.reader = ctx.shard_reader(reader) if ctx is not None else reader
        self.rows = hp.batch_size // (ctx.world_size if ctx is not None else 1)
        self.batches = iter(self.reader)
        self.state = None

    def next_batch(self) -> Any:
        try:
            return next(self.batches)
        except StopIteration:
            self.batches, self.state = iter(self.reader), None
            return next(self.batches)

    def run(self, steps: int) -> float:
        result = None
        for _ in range(steps):
            batch = self.next_batch()
            if self.spec.streamed and self.state is None:
                self.state = self.model.initial_state(self.rows, batch["inputs"].device)
            result = self.step_fn([batch], self.state)
            self.state = result.state if self.spec.streamed else None
        return float(result.loss) if result is not None else float("nan")


def workloads(names: list[str], ptb_raw: str) -> list[dict[str, Any]]:
    from hotloop.hparams import get_hparams
    from hotloop.registry import models, problems
    out = []
    for name in names:
        if name == "lstm":
            hp = get_hparams("lstm_lm_small")
            problem = problems.get("ptb_lm")(raw_dir=ptb_raw)
            out.append({"name": "lstm_lm_small / ptb_lm", "hp": hp, "problem": problem,
                        "model_cls": models.get("lstm_lm"), "unit": "tokens",
                        "per_step": hp.batch_size * problem.num_steps(hp), "steps": 10})
        elif name == "conv":
            hp = get_hparams("conv_net_base")
            problem = problems.get("image_synthetic")()
            out.append({"name": "conv_net_base / image_synthetic", "hp": hp, "problem": problem,
                        "model_cls": models.get("conv_net"), "unit": "examples",
                        "per_step": hp.batch_size, "steps": 6})
        else:
            raise SystemExit(f"unknown workload {name!r}; use lstm and/or conv")
    return out


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from hotloop.parallel import ProcessGroupContext, optimizer_state_bytes
    from hotloop.parallel.group import init_process_group
    from hotloop.parallel.launch import worker_entry

    @worker_entry
    def main() -> None:
        from hotloop.tools.hardware import machine_header
        print(machine_header("benchmarks/data_parallel.py"), flush=True)
        init_process_group("gloo")
        rank = dist.get_rank()
        report: dict[str, Any] = {}
        for work in workloads(args.workloads, args.ptb_raw):
            if rank == 0:
                work["problem"].prepare()
            dist.barrier()
            runners = {"single": Runner(work, None) if rank == 0 else None,
                       "allreduce": Runner(work, ProcessGroupContext("allreduce", args.bucket_mb)),
                       "reduce": Runner(work, ProcessGroupContext("reduce", args.bucket_mb)),
                       "fsdp": Runner(work, ProcessGroupContext("fsdp"))}
            times: dict[str, list[float]] = {c: [] for c in CONTENDERS}
            idle_cpu: list[float] = []
            names = list(CONTENDERS)
            for round_ in range(args.rounds + 1):          # round 0 is the warm-up
                shift = round_ % len(names)
                for contender in names[shift:] + names[:shift]:
                    key, threads = CONTENDERS[contender]
                    torch.set_num_threads(threads)
                    dist.barrier()
                    start, cpu = time.perf_counter(), time.process_time()
                    runner = runners[key]
                    if runner is not None:
                        runner.run(work["steps"] if round_ else 2)
                    dist.barrier()
                    if round_:
                        times[contender].append(time.perf_counter() - start)
                        if key == "single" and rank == 1:
                            idle_cpu.append(time.process_time() - cpu)
            state_bytes = {c: optimizer_state_bytes(runners[key].optimizer)
                           if runners[key] is not None else 0 for c, (key, _) in CONTENDERS.items()}
            # the same measurement with Adam (2 state tensors per parameter), whatever the workload uses
            adam = {**work, "hp": work["hp"].replace(optimizer="adam")}
            for key, ctx in (("single", None), ("reduce", ProcessGroupContext("reduce", args.bucket_mb))):
                if ctx is not None or rank == 0:
                    probe = Runner(adam, ctx)
                    probe.run(1)
                    state_bytes[f"adam_{key}"] = optimizer_state_bytes(probe.optimizer)
                else:
                    state_bytes[f"adam_{key}"] = 0
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, {"state_bytes": state_bytes, "idle_cpu": idle_cpu})
            if rank == 0:
                per_step = work["per_step"] * work["steps"]
                rate = {c: per_step / statistics.median(t) for c, t in times.items()}
                base = "single_2t"
                params = sum(p.numel() * p.element_size() for p in runners["single"].model.parameters())
                report[work["name"]] = {
                    "unit": f"{work['unit']}/s", "steps_per_round": work["steps"],
                    "rounds": args.rounds, "median_rate": rate,
                    "ratio_vs_single_2t": {c: rate[c] / rate[base] for c in CONTENDERS},
                    "ratio_vs_single_1t": {c: rate[c] / rate["single_1t"] for c in CONTENDERS},
                    "param_bytes": params,
                    "optimizer": work["hp"].optimizer,
                    "optimizer_state_bytes_per_rank": {c: [g["state_bytes"][c] for g in gathered]
                                                       for c in state_bytes},
                    "idle_rank_cpu_s_per_single_round": statistics.median(gathered[1]["idle_cpu"]),
                    "round_times_s": times,
                }
        if rank == 0:
            Path(args.out).write_text(json.dumps(report, indent=2))
        dist.destroy_process_group()

    main()


def table(report: dict[str, Any]) -> str:
    lines = ["| workload | contender | processes x threads | throughput (median) | vs 1x2 | vs 1x1 | "
             "optimizer state per rank |", "|---|---|---|---|---|---|---|"]
    for name, r in report.items():
        for c, (key, threads) in CONTENDERS.items():
            state = r["optimizer_state_bytes_per_rank"][c]
            state = state[:1] if key == "single" else state
            mem = " / ".join(f"{b / 2**20:.2f} MiB" for b in state)
            shape = f"{1 if key == 'single' else 2} x {threads}"
            lines.append(f"| {name} | {c} | {shape} | {r['median_rate'][c]:,.0f} {r['unit']} | "
                         f"{r['ratio_vs_single_2t'][c]:.2f}x | {r['ratio_vs_single_1t'][c]:.2f}x | "
                         f"{mem} ({r['optimizer']}) |")
    lines += ["", "| workload | Adam state, 1 process | Adam state per rank, reduce mode (2 ranks) |",
              "|---|---|---|"]
    for name, r in report.items():
        per_rank = r["optimizer_state_bytes_per_rank"]
        lines.append(f"| {name} | {per_rank['adam_single'][0] / 2**20:.2f} MiB | "
                     + " / ".join(f"{b / 2**20:.2f} MiB" for b in per_rank["adam_reduce"]) + " |")
    return "\n".join(lines)


def _machine(load_before: tuple[float, ...]) -> dict[str, Any]:
    import torch
    return {"cpu": _cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "backend": "gloo (loopback)",
            "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--workloads", default="lstm,conv")
    parser.add_argument("--ptb-raw", default=str(REPO.parent / "shared" / "data" / "ptb"))
    parser.add_argument("--fsdp-memory", action="store_true",
                        help="per-rank memory of BERT under FSDP vs DDP at 2 and 4 ranks, and both loss curves")
    parser.add_argument("--hparams", default="bert_base", help="--fsdp-memory: the BERT hparams set")
    parser.add_argument("--steps", type=int, default=50, help="--fsdp-memory: steps at 2 ranks (loss curves)")
    parser.add_argument("--memory-steps", type=int, default=2, help="--fsdp-memory: steps at 4 ranks")
    parser.add_argument("--batch", type=int, default=8, help="--fsdp-memory: global batch (a multiple of 4)")
    parser.add_argument("--seq-len", type=int, default=32, help="--fsdp-memory: tokens per example")
    parser.add_argument("--vocab", type=int, default=30522, help="--fsdp-memory: vocabulary size")
    parser.add_argument("--ddp-at-4", action="store_true", help="--fsdp-memory: also run DDP on 4 ranks")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fsdp-memory-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--modes", default="allreduce,fsdp", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    if args.worker:
        worker(args)
        return
    from fsdp_memory import memory_worker, run_memory
    if args.fsdp_memory_worker:
        memory_worker(args)
        return
    from hotloop.parallel.launch import launch
    load_before = os.getloadavg()
    if args.fsdp_memory:
        if args.batch % 4:
            raise SystemExit("--batch must be a multiple of 4 (4 ranks)")
        report = {"machine": _machine(load_before), **run_memory(args, __file__, REPO, launch)}
        print(json.dumps({k: report[k] for k in ("machine", "memory_ratio", "config")}, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        argv = [__file__, "--worker", "--out", str(out), "--rounds", str(args.rounds),
                "--bucket-mb", str(args.bucket_mb), "--workloads", ",".join(args.workloads),
                "--ptb-raw", args.ptb_raw]
        launch(2, argv, module=False, env={  # a slow contender keeps the other rank in a barrier
            "HOTLOOP_DIST_TIMEOUT_S": "1800",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
        report = json.loads(out.read_text())
    machine = _machine(load_before)
    print(f"machine: {machine}")
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "results": report}, indent=2))


if __name__ == "__main__":
    main()
