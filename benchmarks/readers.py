"""Data-bound input-pipeline benchmark: sync vs async prefetch vs async + workers vs speed test.

A synthetic job where every sample costs real CPU work in numpy (a few
small matmul+tanh layers on a random [32, 64] array) and the model step is a
small MLP trained with SGD in torch. Contenders run interleaved in one
process after a warm-up; the table reports medians over rounds.

    PYTHONPATH=. nice -n 10 python benchmarks/readers.py [--json FILE]
    PYTHONPATH=. python benchmarks/readers.py --sharded [--json FILE]   # benchmarks/sharded_readers.py

``async_workers_vs_speedtest`` = samples/s of async + workers (whole batches
mapped in the workers) divided by the speed-test (compute-only) rate: 1.0
means the input pipeline is fully hidden. The per-sample-map variant (one
worker message per ``chunksize`` samples, collated in this process) is
reported too.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per process (workers inherit it)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from hotloop.data import from_arrays, prefetch, speed_test  # noqa: E402

__all__ = ["make_sample", "main"]

SAMPLE_SHAPE = (32, 64)
WORK_REPS = 6  # matmul+tanh layers per sample (the per-sample CPU cost)
HIDDEN = 1024  # MLP width (the step's CPU cost)
_W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8.0


def make_sample(index: int) -> dict[str, np.ndarray]:
    """Deterministic per-sample work: random features pushed through ``WORK_REPS`` layers."""
    rng = np.random.default_rng(int(index))
    x = rng.standard_normal(SAMPLE_SHAPE).astype(np.float32)
    for _ in range(WORK_REPS):
        x = np.tanh(x @ _W)
    return {"inputs": x.reshape(-1), "targets": np.int64(index % 10)}


def make_batch(indices: np.ndarray) -> dict[str, np.ndarray]:
    """A whole batch of samples (one worker message per batch instead of one per sample)."""
    samples = [make_sample(i) for i in indices]
    return {key: np.stack([s[key] for s in samples]) for key in samples[0]}


def as_tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(value) for key, value in batch.items()}  # zero-copy


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    features = SAMPLE_SHAPE[0] * SAMPLE_SHAPE[1]
    model = nn.Sequential(nn.Linear(features, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    loss = nn.functional.cross_entropy(model(batch["inputs"]), batch["targets"])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _run_epoch(feed: Any, model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int, float, float]:
    """(samples, batches, wall seconds, CPU seconds of this process: step + its threads)."""
    samples = batches = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in feed:
        _step(model, opt, batch)
        samples += int(batch["inputs"].shape[0])
        batches += 1
    return samples, batches, time.perf_counter() - start, time.process_time() - cpu


def _calibrate(batch_size: int, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    """CPU seconds (not wall: robust to other load) of one batch's data work and one step."""
    items = [make_sample(i) for i in range(batch_size)]
    start = time.process_time()
    for i in range(batch_size * 3):
        make_sample(i)
    data_s = (time.process_time() - start) / 3
    batch = {"inputs": torch.from_numpy(np.stack([i["inputs"] for i in items])),
             "targets": torch.from_numpy(np.stack([i["targets"] for i in items]))}
    for _ in range(3):
        _step(model, opt, batch)
    start = time.process_time()
    for _ in range(10):
        _step(model, opt, batch)
    return {"data_cpu_s_per_batch": data_s, "step_cpu_s_per_batch": (time.process_time() - start) / 10}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import sys
    if "--sharded" in (sys.argv[1:] if argv is None else argv):   # per-rank input time at 1, 2, 4 ranks
        from benchmarks.sharded_readers import main as sharded_main
        return sharded_main(argv)
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/readers.py"), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=32, help="batches per timed epoch")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--chunksize", type=int, default=16, help="items per worker message")
    parser.add_argument("--inflight", type=int, default=4, help="chunks in flight per worker")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the step uses one core; the workers get the others
    model, opt = _model()
    calib = _calibrate(args.batch_size, model, opt)
    n = args.batch_size * args.batches
    indices = np.arange(n)

    def per_sample(workers: int = 0) -> Any:  # map each sample, then collate in this process
        return (from_arrays(indices).map(make_sample, workers=workers, chunksize=args.chunksize,
                                          inflight=args.inflight).batch(args.batch_size))

    def per_batch(workers: int) -> Any:       # batch the indices, map whole batches in the workers
        return (from_arrays(indices).batch(args.batch_size, collate=np.asarray)
                .map(make_batch, workers=workers, inflight=args.inflight).map(as_tensors))

    sync_reader, async_reader = per_sample(), per_sample()
    sample_workers, batch_workers = per_sample(args.workers), per_batch(args.workers)
    w = args.workers
    contenders: dict[str, Callable[[], Any]] = {
        "sync": lambda: sync_reader,
        "async_prefetch": lambda: prefetch(async_reader, capacity=args.capacity),
        f"async+{w}workers(per-sample map)": lambda: prefetch(sample_workers, capacity=args.capacity),
        f"async+{w}workers(per-batch map)": lambda: prefetch(batch_workers, capacity=args.capacity),
        "speed_test(compute-only)": lambda: speed_test(per_sample(), n_prepared=8),
    }
    feeds = {name: make() for name, make in contenders.items()}
    rates: dict[str, list[float]] = {name: [] for name in feeds}
    main_cpu: dict[str, list[float]] = {name: [] for name in feeds}
    load_before = os.getloadavg()[0]
    for round_index in range(args.rounds + 1):  # round 0 is the warm-up
        for name, feed in feeds.items():
            samples, batches, seconds, cpu = _run_epoch(feed, model, opt)
            if round_index > 0:
                rates[name].append(samples / seconds)
                main_cpu[name].append(cpu / batches)
    sample_workers.close()
    batch_workers.close()
    load = (load_before, os.getloadavg()[0])
    rows = [{"name": name, "samples_per_s": statistics.median(r), "min": min(r), "max": max(r),
             "main_process_cpu_ms_per_batch": 1e3 * statistics.median(main_cpu[name])}
            for name, r in rates.items()]
    by_name = {row["name"]: row["samples_per_s"] for row in rows}
    compute_only = by_name["speed_test(compute-only)"]
    ratio = by_name[f"async+{w}workers(per-batch map)"] / compute_only
    per_sample_ratio = by_name[f"async+{w}workers(per-sample map)"] / compute_only
    result = {"rows": rows, "async_workers_vs_speedtest": ratio,
              "async_per_sample_workers_vs_speedtest": per_sample_ratio,
              "config": {**vars(args), "torch_threads": torch.get_num_threads(), "blas_threads": 1,
                         "cpus": os.cpu_count(), "load_average_1min": load, **calib}}
    print(f"threads: torch={torch.get_num_threads()} blas=1, workers={args.workers}, cpus={os.cpu_count()}, "
          f"batch={args.batch_size}, {args.batches} batches x {args.rounds} rounds (median)")
    print(f"CPU per batch: data {calib['data_cpu_s_per_batch'] * 1e3:.1f} ms, "
          f"step {calib['step_cpu_s_per_batch'] * 1e3:.1f} ms")
    busy = max(load) > (os.cpu_count() or 1)
    print(f"1-min load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs"
          + (" (above the CPU count: no core is idle for the workers)" if busy else ""))
    print(f"{'contender':34s} {'samples/s':>10s} {'min':>7s} {'max':>7s} {'vs speed test':>13s} "
          f"{'main CPU ms/batch':>18s}")
    for row in rows:
        print(f"{row['name']:34s} {row['samples_per_s']:10.0f} {row['min']:7.0f} {row['max']:7.0f} "
              f"{row['samples_per_s'] / compute_only:13.2f} "
              f"{row['main_process_cpu_ms_per_batch']:18.1f}")
    print(f"async_workers_vs_speedtest = {ratio:.3f} (per-batch map; per-sample map: "
          f"{result['async_per_sample_workers_vs_speedtest']:.3f})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
