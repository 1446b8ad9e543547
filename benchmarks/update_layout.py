"""The one-kernel optimizer update of channels_last weights: torch's (copies) against storage order.

For each zoo conv net, two copies of the model in ``channels_last`` layout, each with its hparams'
optimizer built with torch's one-kernel update (``fused=True``, as ``Strategy.fused_kernel`` wires
it) and the same gradients (drawn once, in each parameter's layout). One steps plainly (torch copies
every non-contiguous tensor into a contiguous one and back), the other inside
:func:`hotloop.engine.storage_order.in_storage_order`. Blocks of ``--block`` updates alternate in
order after a warm-up block; update times are medians, ``ordered_vs_torch`` the paired per-round
ratio (above 1: storage order is faster); ``equal`` says whether the parameters came out bitwise
equal after every update of the run.

    python benchmarks/update_layout.py --json docs/data/update_layout.json
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.engine.build import wire_fused_optimizer  # noqa: E402
from hotloop.engine.storage_order import in_storage_order, storage_view  # noqa: E402
from hotloop.optim import build_optimizer  # noqa: E402
from hotloop.param_groups import param_groups  # noqa: E402
from hotloop.tools.hardware import machine_header  # noqa: E402
from zoo import MODEL_OF, SIZES  # noqa: E402
from zoo_stats import paired_speedup, ratio_text  # noqa: E402

__all__ = ["MODELS", "layout_row", "main"]

MODELS = ("yolov3", "deeplabv3plus", "mask_rcnn", "se_resnext50")


def layout_row(name: str, rounds: int = 10, block: int = 5) -> dict[str, Any]:
    """Both updates on ``name``'s model (module doc)."""
    problem, hparams, overrides = SIZES["small"][name]
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides or None)
    models, optimizers = {}, {}
    torch.manual_seed(0)
    grads = [torch.randn_like(p) * 1e-2 for p in run.model.to(memory_format=torch.channels_last).parameters()]
    for key in ("torch", "ordered"):
        models[key] = copy.deepcopy(run.model)
        optimizers[key] = build_optimizer(param_groups(models[key], run.hp), run.hp, fused=True)
        wire_fused_optimizer(optimizers[key], True, kernel=True)
    params = {key: list(model.parameters()) for key, model in models.items()}
    times: dict[str, list[float]] = {"torch": [], "ordered": []}
    equal = True
    for r in range(rounds + 1):
        for key in (("torch", "ordered") if r % 2 else ("ordered", "torch")):
            start = time.perf_counter()
            for _ in range(block):
                for p, g in zip(params[key], grads):
                    p.grad = g           # read, never written, by the update
                with in_storage_order(optimizers[key]) if key == "ordered" else contextlib.nullcontext():
                    optimizers[key].step()
            if r > 0:
                times[key].append((time.perf_counter() - start) / block)
        equal = equal and all(torch.equal(a, b) for a, b in zip(params["torch"], params["ordered"]))
    return {"model": name, "optimizer": run.hp.optimizer, "parameters": len(params["torch"]),
            "non_contiguous": sum(storage_view(p) is not None for p in params["torch"]),
            "update_ms": {key: 1e3 * statistics.median(ts) for key, ts in times.items()},
            "ordered_vs_torch": paired_speedup(times["torch"], times["ordered"]), "equal": equal,
            "rounds": rounds, "block": block}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    header = machine_header("benchmarks/update_layout.py")
    print(header)
    rows = []
    for name in args.models.split(","):
        row = layout_row(name, args.rounds)
        ms = row["update_ms"]
        print(f"[{name}] {row['non_contiguous']}/{row['parameters']} parameters channels_last; update "
              f"torch {ms['torch']:.3f} ms, storage order {ms['ordered']:.3f} ms, "
              f"{ratio_text(row['ordered_vs_torch'])}; equal {row['equal']}")
        rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "threads": torch.get_num_threads(),
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
