"""Per-rank input time at 1, 2 and 4 ranks for the same global batch (readers that shard).

Each rank of a data-parallel job iterates ``ShardedReader(reader, rank, N)``; this times one
epoch of every rank's reader in this process, one after the other (the input work of a rank does
not depend on the others), for the same global batches at N = 1, 2, 4. Contenders:

- ``map_style``: ``from_arrays(indices).map(make_sample).batch(B)``, a per-sample numpy cost
  (``benchmarks/readers.py``'s ``make_sample``): a rank reads and maps only its rows;
- ``cut_out``: the same reader with its ``shard`` hidden, so every rank makes the whole batch and
  keeps its rows (the path of a reader that cannot shard);
- ``lm_windows``: ``stream_windows`` over random tokens (``ptb_lm``'s reader).

    PYTHONPATH=. python benchmarks/readers.py --sharded --json docs/data/sharded_readers.json

Rounds are interleaved; the table reports the median over rounds of each N's slowest rank,
and its ratio to N = 1 (the goal at 4 ranks is <= 0.35).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from hotloop.data import from_arrays, stream_windows
from hotloop.data.wrapper import ReaderWrapper
from hotloop.parallel import ShardedReader

__all__ = ["main"]

WORLDS = (1, 2, 4)


class _Whole(ReaderWrapper):
    """A reader with its ``shard`` hidden: ranks cut their rows out of whole batches."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __iter__(self) -> Any:
        return iter(self.reader)

    def __len__(self) -> int:
        return len(self.reader)


def _epoch_seconds(make: Callable[[], Any], world: int) -> float:
    """The slowest rank's seconds for one epoch of its rows."""
    slowest = 0.0
    for rank in range(world):
        reader = ShardedReader(make(), rank, world)
        start = time.perf_counter()
        for _batch in reader:
            pass
        slowest = max(slowest, time.perf_counter() - start)
    return slowest


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.readers import make_sample
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/sharded_readers.py"), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch")
    parser.add_argument("--batches", type=int, default=16, help="batches per epoch")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (median)")
    parser.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)   # readers.py's flag
    args = parser.parse_args(argv)
    n = args.batch_size * args.batches
    indices = np.arange(n)
    tokens = np.random.default_rng(0).integers(0, 10_000, size=n * 40).astype(np.int32)
    contenders: dict[str, Callable[[], Any]] = {
        "map_style": lambda: from_arrays(indices).map(make_sample).batch(args.batch_size),
        "cut_out": lambda: _Whole(from_arrays(indices).map(make_sample).batch(args.batch_size)),
        "lm_windows": lambda: stream_windows(tokens, args.batch_size, 35),
    }
    times: dict[str, dict[int, list[float]]] = {name: {w: [] for w in WORLDS} for name in contenders}
    load_before = os.getloadavg()[0]
    for round_index in range(args.rounds + 1):   # round 0 warms up
        for name, make in contenders.items():
            for world in WORLDS:
                seconds = _epoch_seconds(make, world)
                if round_index:
                    times[name][world].append(seconds)
    load = (load_before, os.getloadavg()[0])
    median = {name: {str(w): statistics.median(v) for w, v in per.items()} for name, per in times.items()}
    ratio = {name: {str(w): m[str(w)] / m["1"] for w in WORLDS[1:]} for name, m in median.items()}
    result = {"per_rank_input_s": median, "ratio_to_one_rank": ratio,
              "config": {**{k: v for k, v in vars(args).items() if k != "sharded"},
                         "cpus": os.cpu_count(), "load_average_1min": load}}
    print(f"global batch {args.batch_size}, {args.batches} batches per epoch, {args.rounds} rounds (median of "
          f"the slowest rank); 1-min load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'reader':12s} " + " ".join(f"{f'{w} rank(s) s':>12s}" for w in WORLDS)
          + " " + " ".join(f"{f'{w} vs 1':>8s}" for w in WORLDS[1:]))
    for name, m in median.items():
        print(f"{name:12s} " + " ".join(f"{m[str(w)]:12.4f}" for w in WORLDS)
              + " " + " ".join(f"{ratio[name][str(w)]:8.2f}" for w in WORLDS[1:]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
