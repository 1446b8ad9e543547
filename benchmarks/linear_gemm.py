"""A linear layer's three GEMMs from the BLAS (``F.linear``) against oneDNN's (``linear_gemm="onednn"``).

Each case is one ``[M, K] -> [M, N]`` linear layer with bias, its forward and backward (input,
weight and bias gradients of the sum of squares), at the shapes of ``bert_small`` and
``transformer_base_small``'s steps (4096 token rows; the MLM head's 256 rows). The two are
interleaved after two warm-up calls, the median of ``--repeats`` calls each; a ratio above 1 means
oneDNN's GEMMs are faster. GFLOP/s counts the three GEMMs (6MKN). Printed and written (``--json``):
milliseconds per call, GFLOP/s, the ratio and the largest relative difference of the output and
the weight gradient. Run it with ``ONEDNN_MAX_CPU_ISA=AVX2`` to see oneDNN held to the
instructions of a CPU without AVX-512.

    python benchmarks/linear_gemm.py [--repeats 15] [--json F]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hotloop.ops.linear_gemm import linear  # noqa: E402
from hotloop.tools.hardware import detect_hardware, machine_header  # noqa: E402
from zoo_stats import cpu_flags  # noqa: E402

#: (label, M, K, N)
CASES = (("bert_small qkv", 4096, 256, 768), ("bert_small ffn in", 4096, 256, 1024),
         ("bert_small ffn out", 4096, 1024, 256), ("attention out", 4096, 256, 256),
         ("bert_small mlm head", 256, 256, 8000), ("transformer_base_small ffn in", 4096, 256, 1024))

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return linear(x, w, b, "onednn")


def _call(fn: Linear, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    fn(x, w, b).square().sum().backward()
    return time.perf_counter() - start


def case_row(label: str, m: int, k: int, n: int, repeats: int) -> dict[str, Any]:
    """Both interleaved on one case: medians, GFLOP/s, ratio, differences."""
    torch.manual_seed(0)
    x = torch.randn(m, k, requires_grad=True)
    w = (torch.randn(n, k) * k ** -0.5).requires_grad_()
    b = torch.randn(n, requires_grad=True)
    outs, grads = [], []
    for fn in (F.linear, _onednn):
        w.grad = None
        y = fn(x, w, b)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append(w.grad.clone())
    times: dict[str, list[float]] = {"blas": [], "onednn": []}
    for r in range(repeats + 2):
        for name in (("blas", "onednn") if r % 2 == 0 else ("onednn", "blas")):
            seconds = _call(F.linear if name == "blas" else _onednn, x, w, b)
            if r >= 2:
                times[name].append(seconds)
    ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    flops = 6 * m * k * n

    def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
        return float((a - ref).abs().max() / ref.abs().max())
    return {"case": label, "m": m, "k": k, "n": n, "blas_ms": ms["blas"], "onednn_ms": ms["onednn"],
            "blas_gflops": flops / ms["blas"] / 1e6, "onednn_gflops": flops / ms["onednn"] / 1e6,
            "speedup": ms["blas"] / ms["onednn"], "max_out_rel_diff": rel(outs[1], outs[0]),
            "max_wgrad_rel_diff": rel(grads[1], grads[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    header = machine_header("benchmarks/linear_gemm.py")
    print(header)
    rows = []
    for label, m, k, n in CASES:
        row = case_row(label, m, k, n, args.repeats)
        rows.append(row)
        print(f"{label:32s} [{m}x{k}]->{n:5d}  BLAS {row['blas_ms']:7.2f} ms ({row['blas_gflops']:4.0f} GFLOP/s)  "
              f"oneDNN {row['onednn_ms']:7.2f} ms ({row['onednn_gflops']:4.0f} GFLOP/s)  x{row['speedup']:.2f}  "
              f"diff out {row['max_out_rel_diff']:.1e} wgrad {row['max_wgrad_rel_diff']:.1e}")
    if args.json:
        hw = detect_hardware("cpu")
        Path(args.json).write_text(json.dumps({"machine": header, "cpu_flags": cpu_flags(hw),
                                               "torch": torch.__version__, "threads": torch.get_num_threads(),
                                               "repeats": args.repeats, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
