"""A linear layer's three GEMMs from the BLAS (``F.linear``) against oneDNN's (``linear_gemm="onednn"``).

Each case is one ``[M, K] -> [M, N]`` linear layer with bias, its forward and backward (input,
weight and bias gradients of the sum of squares), at the shapes of ``bert_small`` and
``transformer_base_small``'s steps (4096 token rows; the MLM head's 256 rows). The two are
interleaved after two warm-up calls, the median of ``--repeats`` calls each (the timing of
``benchmarks/conv_formulations.py``); a ratio above 1 means
oneDNN's GEMMs are faster. GFLOP/s counts the three GEMMs (6MKN). Printed and written (``--json``):
milliseconds per call, GFLOP/s, the ratio and the largest relative difference of the output and
the weight gradient. Run it with ``ONEDNN_MAX_CPU_ISA=AVX2`` to see oneDNN held to the
instructions of a CPU without AVX-512.

    python benchmarks/linear_gemm.py [--repeats 15] [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hotloop.ops.linear_gemm import linear  # noqa: E402
from hotloop.tools.hardware import detect_hardware, machine_header  # noqa: E402
from conv_formulations import interleaved_pair  # noqa: E402
from zoo_stats import cpu_flags  # noqa: E402

#: (label, M, K, N)
CASES = (("bert_small qkv", 4096, 256, 768), ("bert_small ffn in", 4096, 256, 1024),
         ("bert_small ffn out", 4096, 1024, 256), ("attention out", 4096, 256, 256),
         ("bert_small mlm head", 256, 256, 8000), ("transformer_base_small ffn in", 4096, 256, 1024))

def case_row(label: str, m: int, k: int, n: int, repeats: int) -> dict[str, Any]:
    """Both interleaved on one case (``conv_formulations.interleaved_pair``'s timing): medians,
    GFLOP/s, ratio, differences."""
    torch.manual_seed(0)
    x = torch.randn(m, k, requires_grad=True)
    w = (torch.randn(n, k) * k ** -0.5).requires_grad_()
    b = torch.randn(n, requires_grad=True)
    row = interleaved_pair(label, x, w, lambda xs, ws: F.linear(xs, ws, b),
                           lambda xs, ws: linear(xs, ws, b, "onednn"), repeats)
    blas_ms, onednn_ms = row["aten_ms"], row["formulation_ms"]
    with torch.no_grad():
        ref = F.linear(x, w, b)
        out_diff = float((linear(x, w, b, "onednn") - ref).abs().max() / ref.abs().max())
    flops = 6 * m * k * n
    return {"case": label, "m": m, "k": k, "n": n, "blas_ms": blas_ms, "onednn_ms": onednn_ms,
            "blas_gflops": flops / blas_ms / 1e6, "onednn_gflops": flops / onednn_ms / 1e6,
            "speedup": row["speedup"], "max_out_rel_diff": out_diff, "max_wgrad_rel_diff": row["max_wgrad_rel_diff"]}


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
