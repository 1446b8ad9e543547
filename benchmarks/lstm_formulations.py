"""The LSTM alone: every ``lstm_impl`` formulation, forward + backward, side by side.

Same 2-layer ``nn.LSTM`` parameters, same input ``[T, B, H]`` and state; each
variant runs fwd+bwd once per round, rounds interleaved (order fixed, first two
rounds discarded), median ms. Also prints each variant's largest relative error
(outputs, final state, all gradients) against ``fused`` fp32.

    PYTHONPATH=. python benchmarks/lstm_formulations.py --hidden 1500 --steps 35 --rounds 8
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from hotloop.models.lstm_cells import run_lstm

__all__ = ["main"]

VARIANTS: dict[str, tuple[str, torch.dtype | None, bool]] = {   # name -> (impl, gemm dtype, autocast)
    "fused fp32 (oneDNN)": ("fused", None, False),
    "fused under bf16 autocast": ("fused", None, True),
    "hoisted fp32": ("hoisted", None, False),
    "bptt fp32": ("bptt", None, False),
    "bptt bf16 GEMMs": ("bptt", torch.bfloat16, False),
}


def _runner(rnn: torch.nn.LSTM, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
            impl: str, dtype: torch.dtype | None, autocast: bool) -> Callable[[], list[torch.Tensor]]:
    def run() -> list[torch.Tensor]:
        rnn.zero_grad(set_to_none=True)
        xs, h0, c0 = (t.detach().clone().requires_grad_() for t in (x, *state))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, (h, c) = run_lstm(impl, rnn, xs, (h0, c0), gemm_dtype=dtype)
        (y.float().pow(2).sum() + 0.3 * h.float().sum() + 0.7 * c.float().sum()).backward()
        return [y.float(), h.float(), c.float(), xs.grad, h0.grad, c0.grad] + [p.grad for p in rnn.parameters()]
    return run


def main(argv: list[str] | None = None) -> None:
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/lstm_formulations.py"), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rnn = torch.nn.LSTM(args.hidden, args.hidden, 2)
    for p in rnn.parameters():
        torch.nn.init.uniform_(p, -0.05, 0.05)
    x = torch.randn(args.steps, args.batch, args.hidden)
    state = (0.1 * torch.randn(2, args.batch, args.hidden), 0.1 * torch.randn(2, args.batch, args.hidden))
    runs = {name: _runner(rnn, x, state, *spec) for name, spec in VARIANTS.items()}
    reference = [t.detach().clone() for t in runs["fused fp32 (oneDNN)"]()]
    errors = {name: max(float((a.detach() - b).norm() / b.norm()) for a, b in zip(run(), reference))
              for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(args.rounds + 2):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    print(f"LSTM 2x{args.hidden}, T={args.steps}, B={args.batch}, {args.threads} threads, "
          f"fwd+bwd, median of {args.rounds} interleaved rounds")
    base = statistics.median(times["fused fp32 (oneDNN)"])
    for name in runs:
        ms = 1e3 * statistics.median(times[name])
        print(f"{name:28s} {ms:9.1f} ms  {1e3 * base / ms:5.2f}x  max rel err {errors[name]:.1e}")


if __name__ == "__main__":
    main()
