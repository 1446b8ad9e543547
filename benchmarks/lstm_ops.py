"""The LSTM LM step's elementwise ops alone, side by side: dropout masks and the softmax.

Contenders of each group run interleaved in one process (one call of each per round, after
warm-up; medians), and before every call a 64 MiB buffer is written so the operands start
cold, as they do inside a training step:

- dropout, forward + backward on ``[35, 20, 200]`` (the ``example`` step's three sites):
  ``F.dropout`` (``bernoulli_`` masks) against ``hotloop.ops.dropout`` (``bits16`` masks);
- softmax over ``[700, 10000]`` bf16 logits (the ``example`` step's output layer):
  ``torch.softmax`` into a new tensor, the fused CE's in-place ``_softmax.out``, and
  ``exp_`` alone (one exponentiating pass: the least any softmax can cost).

    PYTHONPATH=. python benchmarks/lstm_ops.py [--rounds 50] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hotloop.ops.dropout import dropout  # noqa: E402
from lstm_ladder import machine_facts, machine_line  # noqa: E402

__all__ = ["time_interleaved", "main"]


def time_interleaved(contenders: dict[str, Callable[[], object]], rounds: int, warmup: int = 5
                     ) -> dict[str, float]:
    """Median milliseconds per call of each contender, interleaved, each call on a cold cache."""
    flush = torch.empty(64 << 20, dtype=torch.uint8)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for rnd in range(warmup + rounds):
        for name, fn in contenders.items():
            flush.fill_(rnd & 0xFF)
            start = time.perf_counter()
            fn()
            if rnd >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    print(f"{machine_line('lstm_ops.py')}; {args.rounds} rounds", flush=True)
    x = torch.randn(35, 20, 200, requires_grad=True)                     # [T, B, H]
    grad = torch.randn(35, 20, 200)
    drop = time_interleaved({
        "F.dropout (bernoulli)": lambda: torch.nn.functional.dropout(x, 0.2, True).backward(grad),
        "hotloop bits16": lambda: dropout(x, 0.2, True, "bits16").backward(grad),
    }, args.rounds)
    logits = torch.randn(700, 10000).to(torch.bfloat16)                  # [N, V] bf16
    work = logits.clone()

    def in_place() -> None:
        work.copy_(logits)
        torch.ops.aten._softmax.out(work, 1, False, out=work)

    def exp_only() -> None:
        work.copy_(logits)
        work.exp_()

    def copy_only() -> None:
        work.copy_(logits)

    soft = time_interleaved({"softmax, new tensor": lambda: torch.softmax(logits, 1),
                             "softmax in place (+ refill)": in_place, "exp_ in place (+ refill)": exp_only,
                             "refill only": copy_only}, args.rounds)
    for title, rows in (("dropout fwd+bwd [35, 20, 200], p=0.2", drop), ("bf16 softmax [700, 10000]", soft)):
        print(title)
        for name, ms in rows.items():
            print(f"  {name:30s} {ms:7.3f} ms")
    print(f"bits16 / F.dropout: {drop['F.dropout (bernoulli)'] / drop['hotloop bits16']:.2f}x faster; softmax in place "
          f"{soft['softmax in place (+ refill)'] - soft['refill only']:.3f} ms, exp_ alone "
          f"{soft['exp_ in place (+ refill)'] - soft['refill only']:.3f} ms (refill subtracted)")
    if args.json:
        Path(args.json).write_text(json.dumps({**machine_facts(), "threads": torch.get_num_threads(),
                                               "rounds": args.rounds, "dropout_ms": drop, "softmax_ms": soft},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
