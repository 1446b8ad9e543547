"""The convolution formulations side by side: aten's against the per-tap weight gradient and the 1x1 GEMM.

Each case is one convolution's forward and backward (input and weight gradients; the loss is
the sum of squares) in channels-last or NCHW layout, the two formulations interleaved after two
warm-up calls, the median of ``--repeats`` calls each:

- ``dilated_conv_wgrad``: a 3x3 convolution with dilation d (aten, and ``"taps"``): DeepLabV3+'s
  ASPP rates on ``deeplabv3plus_small``'s 8x8 map and on a 33x33 map (513 px crops at output
  stride 16), with the share of valid (position, tap) pairs that decides the path;
- ``pointwise_conv``: a 1x1 convolution (aten, and ``"gemm"``) at the shapes of ``yolov3_shapes``'
  levels and ``se_resnext_small``'s stages, with its multiply-adds that decide the path.

A ratio above 1 means the formulation is faster than aten's on that call. Printed and written
(``--json``): milliseconds per call of each, their ratio, the largest weight-gradient difference,
and whether the formulation's own rule (``TAPS_MAX_FRACTION``, ``POINTWISE_GEMM_MAX_MACS``) takes the
call (calls it does not take run aten's code, so their ratio is 1 by construction and they are
timed only to show where the rule's threshold sits).

    python benchmarks/conv_formulations.py [--repeats 15] [--json F]
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

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hotloop.ops.dilated_conv import TAPS_MAX_FRACTION, dilated_conv2d, valid_fraction  # noqa: E402
from hotloop.ops.pointwise_conv import POINTWISE_GEMM_MAX_MACS, pointwise_conv2d  # noqa: E402
from hotloop.tools.hardware import machine_header  # noqa: E402

#: (label, N, C, side, O, dilation)
DILATED = (("deeplabv3plus_small ASPP d2", 16, 256, 8, 64, 2), ("deeplabv3plus_small ASPP d4", 16, 256, 8, 64, 4),
           ("deeplabv3plus_small ASPP d6", 16, 256, 8, 64, 6), ("33x33 map d6", 2, 256, 33, 256, 6),
           ("33x33 map d12", 2, 256, 33, 256, 12), ("33x33 map d18", 2, 256, 33, 256, 18))
#: (label, N, C, side, O)
POINTWISE = (("yolov3_shapes 2x2", 16, 256, 2, 128), ("yolov3_shapes 4x4", 16, 128, 4, 64),
             ("yolov3_shapes 8x8", 16, 64, 8, 32), ("yolov3_shapes 16x16", 16, 32, 16, 16),
             ("se_resnext_small 7x7", 64, 256, 7, 128), ("se_resnext_small 28x28", 64, 64, 28, 64))

Conv = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _call(conv: Conv, x: torch.Tensor, w: torch.Tensor) -> float:
    start = time.perf_counter()
    conv(x, w).square().sum().backward()
    return time.perf_counter() - start


def interleaved_pair(label: str, x: torch.Tensor, w: torch.Tensor, aten: Conv, other: Conv,
                     repeats: int) -> dict[str, Any]:
    """Both formulations interleaved; medians, ratio and the weight gradients' largest difference."""
    grads = []
    for conv in (aten, other):
        w.grad = None
        conv(x, w).square().sum().backward()
        grads.append(w.grad.clone())
    times: dict[str, list[float]] = {"aten": [], "other": []}
    for r in range(repeats + 2):
        for name in (("aten", "other") if r % 2 == 0 else ("other", "aten")):
            seconds = _call(aten if name == "aten" else other, x, w)
            if r >= 2:
                times[name].append(seconds)
    ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return {"case": label, "aten_ms": ms["aten"], "formulation_ms": ms["other"],
            "speedup": ms["aten"] / ms["other"],
            "max_wgrad_rel_diff": float((grads[0] - grads[1]).abs().max() / grads[0].abs().max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    header = machine_header("benchmarks/conv_formulations.py")
    print(header)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for layout, fmt in (("channels_last", torch.channels_last), ("nchw", torch.contiguous_format)):
        for label, n, c, side, o, d in DILATED:
            x = torch.randn(n, c, side, side, generator=gen).contiguous(memory_format=fmt).requires_grad_()
            w = (torch.randn(o, c, 3, 3, generator=gen) * 0.05).contiguous(memory_format=fmt).requires_grad_()
            share = valid_fraction((side, side), (3, 3), (d, d), (d, d))
            row = interleaved_pair(label, x, w, lambda xs, ws, d=d: F.conv2d(xs, ws, None, 1, d, d),
                        lambda xs, ws, d=d: dilated_conv2d(xs, ws, None, (1, 1), (d, d), (d, d), 1, "taps"),
                        args.repeats)
            rows.append({"field": "dilated_conv_wgrad=taps", "layout": layout, **row, "valid_share": share,
                         "taken": share <= TAPS_MAX_FRACTION})
        for label, n, c, side, o in POINTWISE:
            x = torch.randn(n, c, side, side, generator=gen).contiguous(memory_format=fmt).requires_grad_()
            w = (torch.randn(o, c, 1, 1, generator=gen) * 0.05).contiguous(memory_format=fmt).requires_grad_()
            row = interleaved_pair(label, x, w, lambda xs, ws: F.conv2d(xs, ws),
                        lambda xs, ws: pointwise_conv2d(xs, ws, None, "gemm"), args.repeats)
            macs = n * side * side * c * o
            rows.append({"field": "pointwise_conv=gemm", "layout": layout, **row, "macs": macs,
                         "taken": macs <= POINTWISE_GEMM_MAX_MACS})
    for row in rows:
        print(f"{row['field']:24s} {row['layout']:13s} {row['case']:28s} aten {row['aten_ms']:7.2f} ms, "
              f"formulation {row['formulation_ms']:7.2f} ms, x{row['speedup']:.2f}"
              f"{'' if row['taken'] else ' (rule keeps aten)'}, wgrad diff {row['max_wgrad_rel_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "threads": torch.get_num_threads(),
                                               "repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
