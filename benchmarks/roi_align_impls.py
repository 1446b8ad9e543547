"""RoIAlign's two formulations side by side: the gather one and the separable one (two batched GEMMs).

Each case is one RoIAlign call's forward and backward (the loss is the sum of squares) on random
features [8, C, S, S] and K regions spread over the map, both formulations interleaved after two
warm-up calls, the median of ``--repeats`` calls each. The cases: the three calls one step of
``mask_rcnn_shapes`` makes (64 px images: the 7x7 box pool on P2 and P3, the 14x14 mask pool) and
two larger maps where the separable formulation's work grows with the map's area. Printed and
written (``--json``): milliseconds per call of each, their ratio, and the largest difference.

    python benchmarks/roi_align_impls.py [--repeats 15] [--json F]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hotloop.ops import roi_align  # noqa: E402
from hotloop.tools.hardware import machine_header  # noqa: E402

#: (label, regions K, channels C, map side S, output side, stride)
CASES = (("mask_rcnn_shapes box pool, P2", 957, 64, 16, 7, 4),
         ("mask_rcnn_shapes box pool, P3", 64, 64, 8, 7, 8),
         ("mask_rcnn_shapes mask pool, P2", 24, 64, 16, 14, 4),
         ("128 px images, P2", 512, 128, 32, 7, 4),
         ("256 px images, P2", 128, 128, 64, 7, 4))


def _inputs(k: int, c: int, side: int, stride: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    features = torch.randn(8, c, side, side, generator=gen).requires_grad_()
    image = side * stride
    corner = torch.rand(k, 2, generator=gen) * image * 0.8
    size = 2 + torch.rand(k, 2, generator=gen) * image * 0.4
    rois = torch.cat((torch.randint(0, 8, (k, 1), generator=gen).float(), corner, corner + size), 1)   # [K, 5]
    return features, rois


def _call(impl: str, features: torch.Tensor, rois: torch.Tensor, out: int, stride: int) -> float:
    start = time.perf_counter()
    pooled = roi_align(features, rois, out, 1.0 / stride, 2, True, formulation=impl)
    pooled.square().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    header = machine_header("benchmarks/roi_align_impls.py")
    print(header)
    rows = []
    for label, k, c, side, out, stride in CASES:
        features, rois = _inputs(k, c, side, stride, torch.Generator().manual_seed(k))
        with torch.no_grad():
            gather = roi_align(features, rois, out, 1.0 / stride)
            separable = roi_align(features, rois, out, 1.0 / stride, formulation="separable")
        times: dict[str, list[float]] = {"gather": [], "separable": []}
        for r in range(args.repeats + 2):
            for impl in (("gather", "separable") if r % 2 == 0 else ("separable", "gather")):
                seconds = _call(impl, features, rois, out, stride)
                if r >= 2:
                    times[impl].append(seconds)
        ms = {impl: 1e3 * statistics.median(ts) for impl, ts in times.items()}
        row = {"case": label, "regions": k, "channels": c, "map_side": side, "output": out,
               "gather_ms": ms["gather"], "separable_ms": ms["separable"],
               "separable_speedup": ms["gather"] / ms["separable"],
               "max_abs_diff": float((gather - separable).abs().max())}
        rows.append(row)
        print(f"{label:32s} K={k:4d} C={c:3d} {side:2d}x{side:<2d} -> {out}x{out}: gather {ms['gather']:8.2f} ms, "
              f"separable {ms['separable']:8.2f} ms, x{row['separable_speedup']:.2f}, max diff {row['max_abs_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "threads": torch.get_num_threads(),
                                               "repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
