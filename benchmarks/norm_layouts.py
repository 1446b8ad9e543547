"""A zoo model's normalisation calls alone, in NCHW and channels-last: what does the layout cost them?

The shapes are those the model's ``nn.BatchNorm2d`` and ``nn.InstanceNorm2d`` modules see in one
training forward of its small zoo configuration (``benchmarks/zoo.py``), collected by forward
hooks. Each distinct shape's call (a training-mode norm, forward, then backward of a fixed
upstream gradient) is timed in every form, the forms interleaved in rotating order after two
warm-up rounds, the median of ``--repeats`` rounds each, forward and backward apart. A model's
total is each shape's median times the number of calls of that shape in one step. Forms:

- batch norm (affine, batch statistics): ``nchw`` and ``channels_last`` (aten's kernels);
- instance norm (no affine): ``nchw`` and ``channels_last`` (``F.instance_norm``, which copies a
  channels-last map to NCHW and back) and ``per_sample`` in channels-last
  (``Strategy.instance_norm``, :mod:`hotloop.ops.instance_norm`).

    python benchmarks/norm_layouts.py [--models yolov3,deeplabv3plus,se_resnext50,cyclegan] [--repeats 9] [--json F]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.engine.program import model_phases  # noqa: E402
from hotloop.ops.instance_norm import instance_norm2d  # noqa: E402
from hotloop.problems.base import open_reader  # noqa: E402
from hotloop.tools.hardware import machine_header  # noqa: E402
from zoo import MODEL_OF, ZOO  # noqa: E402

__all__ = ["norm_shapes", "time_forms", "main"]

Norm = Callable[[torch.Tensor], torch.Tensor]
Shape = tuple[int, int, int, int]


def norm_shapes(name: str) -> dict[str, Counter]:
    """``{"batch_norm" | "instance_norm": Counter((N, C, H, W) -> calls)}`` of one training forward."""
    problem, hparams, overrides = ZOO[name]
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides)
    seen: dict[str, Counter] = {"batch_norm": Counter(), "instance_norm": Counter()}

    def hook(kind: str) -> Callable[..., None]:
        return lambda module, args, out: seen[kind].update([tuple(args[0].shape)])
    for module in run.model.modules():
        if type(module) is nn.BatchNorm2d:
            module.register_forward_hook(hook("batch_norm"))
        elif type(module) is nn.InstanceNorm2d and not module.affine and not module.track_running_stats:
            module.register_forward_hook(hook("instance_norm"))
    batch = next(iter(open_reader(run.problem, "train", run.hp, workers=0)))
    for phase in model_phases(run.model) or [None]:                  # a GAN: each phase's loss once
        (run.model.loss if phase is None else getattr(run.model, f"{phase.name}_loss"))(batch)
    return seen


def _forms(kind: str, channels: int) -> dict[str, tuple[torch.memory_format, Norm]]:
    if kind == "batch_norm":
        weight, bias = torch.ones(channels, requires_grad=True), torch.zeros(channels, requires_grad=True)

        def batch_norm(x: torch.Tensor) -> torch.Tensor:
            return F.batch_norm(x, None, None, weight, bias, training=True)
        return {"nchw": (torch.contiguous_format, batch_norm), "channels_last": (torch.channels_last, batch_norm)}
    return {"nchw": (torch.contiguous_format, F.instance_norm), "channels_last": (torch.channels_last, F.instance_norm),
            "per_sample": (torch.channels_last, lambda x: instance_norm2d(x, 1e-5, "per_sample"))}


def time_forms(kind: str, shape: Shape, repeats: int) -> dict[str, dict[str, float]]:
    """``{form: {"forward_ms", "backward_ms"}}``: medians of ``repeats`` interleaved rounds."""
    gen = torch.Generator().manual_seed(0)
    data, upstream = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    forms = _forms(kind, shape[1])
    inputs = {name: (data.contiguous(memory_format=fmt), upstream.contiguous(memory_format=fmt))
              for name, (fmt, _) in forms.items()}
    times: dict[str, dict[str, list[float]]] = {name: {"forward": [], "backward": []} for name in forms}
    names = list(forms)
    for r in range(repeats + 2):
        for name in names[r % len(names):] + names[:r % len(names)]:
            x, grad = inputs[name]
            x = x.detach().requires_grad_()
            start = time.perf_counter()
            y = forms[name][1](x)
            middle = time.perf_counter()
            y.backward(grad)
            end = time.perf_counter()
            if r >= 2:
                times[name]["forward"].append(middle - start)
                times[name]["backward"].append(end - middle)
    return {name: {f"{part}_ms": 1e3 * statistics.median(ts) for part, ts in parts.items()}
            for name, parts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="yolov3,deeplabv3plus,se_resnext50,cyclegan")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    header = machine_header("benchmarks/norm_layouts.py")
    print(header)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        for kind, shapes in norm_shapes(name).items():
            if not shapes:
                continue
            totals: Counter = Counter()
            for shape, calls in sorted(shapes.items()):
                timed = time_forms(kind, shape, args.repeats)
                for form, parts in timed.items():
                    for part, ms in parts.items():
                        totals[(form, part)] += ms * calls
                rows.append({"model": name, "norm": kind, "shape": list(shape), "calls": calls, "forms": timed})
            forms = list(timed)                       # every shape times the same forms, in _forms' order
            print(f"[{name}] {kind}: {sum(shapes.values())} calls per forward, {len(shapes)} shapes; per step, ms:")
            for form in forms:
                fwd, bwd = totals[(form, "forward_ms")], totals[(form, "backward_ms")]
                print(f"  {form:14s} forward {fwd:8.2f}  backward {bwd:8.2f}  total {fwd + bwd:8.2f}")
            rows.append({"model": name, "norm": kind, "total": {form: {"forward_ms": totals[(form, "forward_ms")],
                                                                       "backward_ms": totals[(form, "backward_ms")]}
                                                                for form in forms}})
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "threads": torch.get_num_threads(),
                                               "repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
