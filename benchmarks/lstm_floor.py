"""Lower bound on the LSTM LM step time on this machine: its GEMMs alone, at measured speed.

Every formulation of the Zaremba LSTM LM step (same math) performs at least these
matrix products per step (N = T*B tokens, L layers, bias folded as in fused_ce):

- output layer: logits ``[N, H+1] x [H+1, V]``, ``dh = dlogits [N, V] x [V, H+1]``,
  ``dW = dlogits.T [V, N] x [N, H+1]``;
- per LSTM layer: the input projection of all steps ``[N, H] x [H, 4H]``; T
  recurrent ``[B, H] x [H, 4H]`` forward and T ``[B, 4H] x [4H, H]`` backward
  (sequential: they cannot be batched over time); ``dx``, ``dW_ih``, ``dW_hh``
  over all steps.

Each shape is timed alone (median of interleaved repeats, after warm-up) with
the given operand dtype and thread count; the sum is the step's GEMM time with
nothing else (no softmax, gates, optimizer or framework overhead), so
``baseline_ms / floor_ms`` bounds any speedup reachable at these GEMM speeds.

    PYTHONPATH=. python benchmarks/lstm_floor.py --config small --baseline_json /tmp/ladder_small.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hotloop.builtin import declare_builtins
from hotloop.hparams import get_hparams

__all__ = ["gemm_shapes", "gemm_floor", "main"]

CONFIGS = {"small": "lstm_lm_small", "medium": "lstm_lm_medium", "large": "lstm_lm_large",
           "example": "lstm_lm_example"}
VOCAB = 10000


def gemm_shapes(hidden: int, steps: int, batch: int, layers: int, vocab: int = VOCAB
                ) -> list[tuple[str, int, int, int, int, str]]:
    """``(what, M, K, N, count, layout)`` for every GEMM of one training step.

    ``layout`` says which operand is a transposed view, as in the real step:
    "nt" = ``a @ b.T`` (weights stored [out, in]), "tn" = ``a.T @ b``, "nn" = plain.
    """
    n, h = steps * batch, hidden
    out = [("output logits", n, h + 1, vocab, 1, "nt"), ("output dh", n, vocab, h + 1, 1, "nn"),
           ("output dW", vocab, n, h + 1, 1, "tn")]
    out += [("lstm input proj", n, h, 4 * h, layers, "nt"),
            ("lstm recurrent fwd", batch, h, 4 * h, steps * layers, "nt"),
            ("lstm recurrent bwd", batch, 4 * h, h, steps * layers, "nn"),
            ("lstm dx", n, 4 * h, h, layers, "nn"),
            ("lstm dW_ih + dW_hh", 4 * h, n, h, 2 * layers, "tn")]
    return out


def _time_gemm(m: int, k: int, n: int, layout: str, dtype: torch.dtype, repeats: int) -> float:
    a = torch.randn(k, m).to(dtype).t() if layout == "tn" else torch.randn(m, k).to(dtype)
    b = torch.randn(n, k).to(dtype).t() if layout == "nt" else torch.randn(k, n).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_floor(config: str, dtype: torch.dtype, repeats: int = 15) -> dict:
    declare_builtins()
    hp = get_hparams(CONFIGS[config])
    rows, total, flops = [], 0.0, 0.0
    for what, m, k, n, count, layout in gemm_shapes(hp.hidden_size, hp.max_length, hp.batch_size,
                                                    hp.num_layers):
        seconds = _time_gemm(m, k, n, layout, dtype, repeats)
        rows.append({"gemm": what, "shape": [m, k, n], "count": count, "ms_each": 1e3 * seconds,
                     "gflops_per_s": 2 * m * k * n / seconds / 1e9})
        total += count * seconds
        flops += count * 2 * m * k * n
    return {"config": config, "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "rows": rows, "floor_ms": 1e3 * total, "gflop_per_step": flops / 1e9}


def main(argv: list[str] | None = None) -> None:
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/lstm_floor.py"), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--baseline_json", default="", help="a lstm_ladder.py --json file (rung 0 = baseline)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = gemm_floor(args.config, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    print(f"config {args.config}: GEMM operands {result['dtype']}, {result['threads']} threads, "
          f"{result['gflop_per_step']:.2f} GFLOP/step in GEMMs")
    print(f"{'gemm':22s} {'M x K x N':>20s} {'count':>6s} {'ms each':>8s} {'GFLOP/s':>8s}")
    for row in result["rows"]:
        shape = "x".join(map(str, row["shape"]))
        print(f"{row['gemm']:22s} {shape:>20s} {row['count']:6d} {row['ms_each']:8.3f} {row['gflops_per_s']:8.0f}")
    print(f"GEMM-only floor: {result['floor_ms']:.1f} ms/step")
    if args.baseline_json:
        with open(args.baseline_json) as handle:
            ladder = json.load(handle)
        base = ladder["rows"][0]["ms_per_step"]
        result["baseline_ms"] = base
        result["max_speedup"] = base / result["floor_ms"]
        print(f"baseline (ladder rung 0) {base:.1f} ms/step -> at most {result['max_speedup']:.2f}x "
              f"with zero non-GEMM time")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
