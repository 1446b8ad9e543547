"""What a cold and a cached inductor compile of each zoo model's step costs here, against its op count.

For each model (the small CPU configurations of ``benchmarks/zoo.py``), two fresh processes share
one empty compile cache: the first builds hotloop's step with ``backend=inductor`` and times its
first call (a cold compile: every FX graph compiled), the second times the first call again (the
code loaded from the cache). Both report inductor's cache counters, so a row says which it was.
The op count ``ops_per_step`` is counted as the tuner counts eager's step before it proposes
anything (aten ops of one forward, backward and per-tensor optimizer update; the forward and
backward alone, which inductor compiles, are ``forward_backward_ops``; a step whose units compile
one by one (a phased model's networks, a model's ``compile_units()``) counts the ops times the
share of its unit calls of a new kind, ``StepCounts.compiled_ops``). A cold compile is a fixed
start-up plus work per traced op: :func:`price_line` fits that line through the rows and scales it
up until it covers every row with a margin (:data:`MARGIN`), and ``hotloop.tools.compile_prices``
prices a cold compile by it.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/compile_price.py [--models a,b] [--json FILE] [--merge EARLIER...]

``--merge`` adds earlier runs' rows (same machine) to the fit: one model's cold compile varies
from run to run, and the line must cover every run.

JSON: ``{"rows": [{"model", "ops_per_step", "forward_backward_ops", "cold_s", "cold_counts", "cached_s",
"cached_counts", "cold_was_cached", "cached_was_cached", "second_step_s", "cold_seconds_per_op",
"cached_share", "run"}], "not_compiled": [{"model", "why"}],
"price_fixed_s", "price_seconds_per_op", "max_cached_share", "machine", "cpu"}``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _one(name: str) -> dict[str, Any]:
    """First and second step of ``name``'s inductor step in this process (cache folder from the env)."""
    import torch

    import hotloop  # noqa: F401 - declares the registry names
    from hotloop.compose.build import build_run
    from hotloop.data import to_device
    from hotloop.engine import Strategy, build_step
    from hotloop.engine.compiled_networks import network_types
    from hotloop.tools.model_facts import analyze_model, counting
    from hotloop.tools.proposals import baseline_strategy
    from zoo import MODEL_OF, ZOO

    problem, hparams, overrides = ZOO[name]
    device = torch.device("cpu")
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides or None, device=device)
    batch = to_device(next(iter(run.problem.reader("train", run.hp))), device)
    fwd_bwd_ops = analyze_model(run.model, batch).ops_per_step
    eager = build_step(copy.deepcopy(run.model).train(), run.hp, baseline_strategy())
    eager.step([batch])
    with counting(network_types(run.model)) as counts:   # as the tuner counts eager's step (the per-tensor
        eager.step([batch])                               # update's ops too; a phased step's distinct calls)
    built = build_step(run.model.train(), run.hp, Strategy(backend="inductor", fused_optimizer=False))
    backend = built.step.backend
    start = time.perf_counter()
    float(built.step([batch]).loss)
    first = time.perf_counter() - start
    start = time.perf_counter()
    float(built.step([batch]).loss)
    second = time.perf_counter() - start
    stats = getattr(backend, "compile_stats", None)      # None: the step fell back to eager
    return {"ops_per_step": counts.compiled_ops, "forward_backward_ops": fwd_bwd_ops, "first_step_s": first,
            "second_step_s": second,
            "compile_s": stats.seconds if stats else None, "counts": stats.counts if stats else {},
            "cached": bool(stats and stats.cached), "fallback": backend.fallback_reason}


#: the price line sits this much above the slowest row: one model's cold compile varies between runs
MARGIN = 1.15


def price_line(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(fixed seconds, seconds per op) of a cold compile: the least-squares line through the rows'
    (``ops_per_step``, ``cold_s``), scaled up until no row took longer than it prices, then by MARGIN."""
    xs, ys = [float(r["ops_per_step"]) for r in rows], [float(r["cold_s"]) for r in rows]
    if len(rows) < 2 or max(xs) == min(xs):
        return 0.0, MARGIN * max(y / x for x, y in zip(xs, ys))
    slope, fixed = statistics.linear_regression(xs, ys)
    slope, fixed = max(slope, 0.0), max(fixed, 0.0)
    scale = MARGIN * max(y / (fixed + slope * x) for x, y in zip(xs, ys))
    return fixed * scale, slope * scale


def _earlier(path: Path, machine: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, models not compiled) of an earlier run's JSON, which must come from this machine."""
    try:
        data = json.loads(path.read_text())
        rows = data["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"compile_price: cannot read --merge {path}: {exc}")
    if data.get("machine") != machine:
        raise SystemExit(f"compile_price: --merge {path} was measured on another machine: {data.get('machine')}")
    return ([{**row, "run": row.get("run", f"earlier ({path.name})")} for row in rows],
            list(data.get("not_compiled", [])))


def _child(name: str, cache: str) -> dict[str, Any]:
    env = {**os.environ, "HOTLOOP_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
    out = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"compile_price: {name} failed (exit {out.returncode}): {tail}")
    return json.loads(lines[-1])


def _write(path: str | None, machine: str, hw: Any, rows: list[dict[str, Any]],
           skipped: list[dict[str, Any]]) -> None:
    """The JSON of ``rows`` with the price line fitted over them (nothing without ``path``)."""
    if not path:
        return
    import torch
    fixed, per_op = price_line(rows)
    Path(path).write_text(json.dumps(
        {"machine": machine, "cpu": hw.describe(), "torch": torch.__version__, "rows": rows,
         "not_compiled": skipped, "price_fixed_s": fixed, "price_seconds_per_op": per_op,
         "max_cached_share": max(r["cached_share"] for r in rows)}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    from zoo import ZOO
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--merge", nargs="+", default=[], metavar="FILE",
                        help="earlier runs' JSON on this machine: their rows join the fit (run-to-run spread)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_one(args.child)))
        return 0
    from hotloop.tools.hardware import detect_hardware, machine_header
    import torch
    machine = machine_header("benchmarks/compile_price.py")
    print(machine)
    hw = detect_hardware(torch.device("cpu"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {hw.describe()}", flush=True)
    names = [n for n in args.models.split(",") if n]     # --models '' with --merge: fit those rows only
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; the zoo has {', '.join(ZOO)}")
    merged = [_earlier(Path(path), machine) for path in args.merge]
    earlier = [row for rows_of, _ in merged for row in rows_of]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if not names and not earlier:
        parser.error("nothing to fit: name --models, or --merge earlier runs")
    rows: list[dict[str, Any]] = []
    skipped = list({s["model"]: s for _, not_compiled in merged for s in not_compiled}.values())
    for name in names or [None]:
        if name is None:           # only merged rows
            _write(args.json, machine, hw, earlier, skipped)
            break
        with tempfile.TemporaryDirectory(prefix="hotloop-compile-price-") as cache:
            cold = _child(name, cache)
            if cold["fallback"] or cold["compile_s"] is None:     # a phased step runs eagerly
                print(f"{name:18s} not compiled: {cold['fallback']}", flush=True)
                skipped = [s for s in skipped if s["model"] != name] + [{"model": name, "why": cold["fallback"]}]
                if earlier + rows:
                    _write(args.json, machine, hw, earlier + rows, skipped)
                continue
            cached = _child(name, cache)
        row = {"model": name, "ops_per_step": cold["ops_per_step"],
               "forward_backward_ops": cold["forward_backward_ops"],
               "cold_s": cold["compile_s"],
               "cold_counts": cold["counts"], "cold_was_cached": cold["cached"],
               "cached_s": cached["compile_s"], "cached_counts": cached["counts"],
               "cached_was_cached": cached["cached"], "second_step_s": cold["second_step_s"],
               "cold_seconds_per_op": cold["compile_s"] / max(1, cold["ops_per_step"]),
               "cached_share": cached["compile_s"] / cold["compile_s"], "run": started}
        rows.append(row)
        print(f"{name:18s} {row['ops_per_step']:6d} ops  cold {row['cold_s']:7.1f} s "
              f"({1000 * row['cold_seconds_per_op']:.1f} ms/op)  cached {row['cached_s']:6.1f} s "
              f"({row['cached_share']:.1%} of cold, all cached: {row['cached_was_cached']})  "
              f"second step {row['second_step_s']:.3f} s", flush=True)
        _write(args.json, machine, hw, earlier + rows, skipped)   # after each model: a cut run keeps its rows
    every = earlier + rows
    fixed, per_op = price_line(every)
    print(f"cold compile price covering every row ({len(every)}, {len(earlier)} of them merged): {fixed:.1f} s "
          f"+ {1000 * per_op:.1f} ms per op; a cached load took at most "
          f"{max(r['cached_share'] for r in every):.1%} of the cold compile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
