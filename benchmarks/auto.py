"""Is ``strategy="auto"`` as good as an exhaustive sweep?

For every registered model (with a small matching problem / hparams set) this
runs, in ONE process:

1. ``hotloop.tools.autotune.tune`` (no cache) for the model's default run
   (planned steps = hparams max_steps, or max_epochs x batches per epoch),
   recording the tuning seconds and auto's choice;
2. the exhaustive grid of the compute knobs that apply on this machine
   (fused_optimizer x intra_op_threads x precision, the graph backend,
   channels_last for conv nets), eager fp32 and auto's choice, timed
   *interleaved* (one step of each per round, rotating order) from the same
   initial weights on the same batches, medians after warm-up.

Input-pipeline knobs (prefetch, workers) are not in the grid: every contender
is fed prepared batches. ``backend=inductor`` is left out of the grid (its
compile takes minutes on 2 shared cores) and auto admits it only when 5% of
the run can pay for that compile.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/auto.py [--json FILE] [--steps N] [--models a,b]

(``DIR`` holds ``ptb/``: the raw-data root; ``--raw-root DIR`` does the same.)

The sweep's fastest contender is the fastest of many noisy medians, so it is biased low;
when it is not auto's choice, auto, that contender and eager are timed again in a fresh
interleaved final (twice the steps), and the ratios below come from the final (the
sweep's own are kept as ``sweep_auto_vs_best`` / ``sweep_auto_vs_eager``).

Ratios: ``auto_vs_best = best median / auto median`` (goal >= 0.95),
``auto_vs_eager = eager median / auto median`` (goal >= 1),
``tune_fraction = tune seconds / (planned steps x eager median)`` (goal <= 0.05).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model  # noqa: E402
from hotloop.registry import models  # noqa: E402
from hotloop.tools.autotune import read_batches, tune  # noqa: E402
from hotloop.compose.plan import planned_steps  # noqa: E402
from hotloop.tools.hardware import detect_hardware  # noqa: E402
from hotloop.tools.proposals import baseline_strategy  # noqa: E402
from hotloop.tools.trials import Trial, TrialRunner  # noqa: E402
from hotloop.tools.tune_report import strategy_diff  # noqa: E402

# model -> (problem, hparams set): a small matching configuration for each registered model
CONFIGS: dict[str, tuple[str, str]] = {
    "transformer": ("algorithmic_reverse", "transformer_algorithmic"),
    "mlp": ("algorithmic_reverse", "mlp_algorithmic"),
    "lstm_seq2seq": ("algorithmic_reverse", "lstm_seq2seq_algorithmic"),
    "conv_net": ("image_synthetic", "conv_net_base"),
    "lstm_lm": ("ptb_lm", "lstm_lm_small"),
    "multimodel": ("algorithmic_copy,algorithmic_reverse", "multimodel_tiny"),
    # the zoo's small sets (benchmarks/zoo.py); bert_tiny, mask_rcnn_tiny keep the grid affordable
    "se_resnext50": ("image_mnist", "se_resnext_small"),
    "deeplabv3plus": ("segment_shapes", "deeplabv3plus_small"),
    "cyclegan": ("shapes_unpaired", "cyclegan_small"),
    "bert": ("bert_pretrain_ptb", "bert_tiny"),
    "yolov3": ("detection_shapes", "yolov3_shapes"),
    "mask_rcnn": ("detection_shapes", "mask_rcnn_tiny"),
}
COMPUTE_FIELDS = ("fused_optimizer", "intra_op_threads", "precision", "backend", "channels_last",
                  "executor", "graph_passes", "inplace", "onednn")


def compute_key(strategy: Strategy) -> tuple:
    return tuple(getattr(strategy, f) for f in COMPUTE_FIELDS)


def grid(model: torch.nn.Module, fast_bf16: bool) -> list[Strategy]:
    """Every combination of the compute knobs that apply to ``model`` on this CPU."""
    base = baseline_strategy()
    precisions = ("fp32", "bf16") if fast_bf16 else ("fp32",)
    has_conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    out = []
    for fused, threads, precision in itertools.product((False, True), (0, 1), precisions):
        out.append(base.replace(fused_optimizer=fused, intra_op_threads=threads, precision=precision))
    for threads in (0, 1):
        out.append(base.replace(fused_optimizer=True, intra_op_threads=threads, backend="graph"))
    if has_conv:
        out += [s.replace(channels_last=True) for s in list(out) if s.backend == "eager"]
    valid = []
    for s in out:
        try:
            s.validate("cpu")
            validate_for_model(s, model)
        except StrategyError:
            continue
        valid.append(s)
    return valid


def sweep(run: Any, contenders: list[Trial], steps: int, warmup: int) -> None:
    batches, _ = read_batches(run.problem, run.hp, 16 * max(1, run.hp.accum_steps), torch.device("cpu"))
    runner = TrialRunner(run.model, run.hp, batches, torch.device("cpu"), warmup=warmup)
    live = [t for t in contenders if runner.prepare(t)]
    for r in range(warmup + steps):
        shift = r % len(live)
        for trial in live[shift:] + live[:shift]:
            if trial.status == "ok":
                runner.step(trial)
    runner.release(contenders)


def bench_model(name: str, steps: int, warmup: int, log: Any) -> dict[str, Any]:
    from hotloop.compose.build import build_run
    problem, hparams = CONFIGS[name]
    run = build_run(problem, name, hparams)   # missing data is an error, not a skip
    planned = planned_steps(run.problem, run.hp) or 1000
    report = tune(run.model, run.problem, run.hp, "cpu", planned, cache=False, log=lambda line: None)
    tune_s = report.tune_seconds   # excludes the one-time torch._dynamo import every run pays anyway
    hw = detect_hardware()
    base = baseline_strategy()
    contenders: dict[tuple, Trial] = {}
    for s in grid(run.model, hw.fast_bf16):
        contenders.setdefault(compute_key(s), Trial(strategy_diff(s, base), s, "grid"))
    auto_key = compute_key(report.strategy)
    if auto_key not in contenders:
        contenders[auto_key] = Trial("auto", report.strategy.replace(prefetch=0, num_workers=0), "auto")
    trials = list(contenders.values())
    sweep(run, trials, steps, warmup)
    measured = [t for t in trials if t.measured]
    eager = contenders[compute_key(base)]
    auto = contenders[auto_key]
    best = min(measured, key=lambda t: t.median)
    eager_ms, auto_ms, best_ms = eager.median * 1e3, auto.median * 1e3, best.median * 1e3
    for t in sorted(measured, key=lambda t: t.median):
        tag = " <- auto" if t is auto else ""
        log(f"  {name:<13} {t.label[:70]:<70} {t.median * 1e3:9.2f} ms{tag}")
    for t in trials:
        if not t.measured:
            log(f"  {name:<13} {t.label[:70]:<70} {t.status}")
    sweep_ratios = {"sweep_auto_vs_best": best_ms / auto_ms, "sweep_auto_vs_eager": eager_ms / auto_ms}
    if best is not auto:
        # the sweep's fastest of many noisy medians is biased low (the winner's curse): a fresh
        # interleaved final of auto, the sweep's best and eager, twice as long, gives the ratios
        final = list({compute_key(t.strategy): Trial(t.label, t.strategy, "final")
                      for t in (auto, best, eager)}.values())
        sweep(run, final, 2 * steps, warmup)
        by_key = {compute_key(t.strategy): t for t in final if t.measured}
        auto_ms, best_ms = by_key[auto_key].median * 1e3, by_key[compute_key(best.strategy)].median * 1e3
        eager_ms = by_key[compute_key(base)].median * 1e3
        log(f"  {name:<13} final ({2 * steps} steps each): auto {auto_ms:.2f} ms, sweep's best {best_ms:.2f} ms, "
            f"eager {eager_ms:.2f} ms")
    return {"model": name, "problem": problem, "hparams": hparams, "planned_steps": planned,
            "auto_choice": strategy_diff(report.strategy, Strategy()), "auto_trial": auto.label,
            "best": best.label, "eager_ms": eager_ms, "auto_ms": auto_ms, "best_ms": best_ms,
            "auto_vs_best": best_ms / auto_ms, "auto_vs_eager": eager_ms / auto_ms, **sweep_ratios,
            "tune_seconds": tune_s, "tune_fraction": tune_s / (planned * eager.median),
            "tune_table": report.rows(), "grid_size": len(trials)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per contender")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default=None, help="comma-separated subset (default: all registered)")
    parser.add_argument("--raw-root", default=None, metavar="DIR", help="raw-data root (HOTLOOP_RAW_ROOT)")
    args = parser.parse_args(argv)
    if args.raw_root:
        import os
        os.environ["HOTLOOP_RAW_ROOT"] = os.path.abspath(args.raw_root)
    names = args.models.split(",") if args.models else models.names()
    threads = torch.get_num_threads()
    print(f"hotloop benchmarks/auto.py: torch {torch.__version__}, {threads} intra-op threads by default, "
          f"{detect_hardware().describe()}; {args.steps} measured steps per contender, interleaved")
    rows = []
    for name in names:
        if name not in CONFIGS:
            rows.append({"model": name, "skipped": "no small matching problem/hparams known to the benchmark"})
            continue
        print(f"[{name}]", flush=True)
        rows.append(bench_model(name, args.steps, args.warmup, lambda line: print(line, flush=True)))
        r = rows[-1]
        if "skipped" not in r:
            print(f"  => auto/best {r['auto_vs_best']:.3f}, auto/eager {r['auto_vs_eager']:.3f}, tune "
                  f"{r['tune_seconds']:.1f} s = {r['tune_fraction']:.2%} of the planned run", flush=True)
        if args.json:                       # written after every model: a partial run keeps its rows
            write_json(args.json, threads, args.steps, rows)
    print(f"\n{'model':<13} {'auto/best':>9} {'auto/eager':>10} {'tune s':>7} {'tune/run':>8}  auto choice")
    for r in rows:
        if "skipped" in r:
            print(f"{r['model']:<13} skipped: {r['skipped']}")
            continue
        print(f"{r['model']:<13} {r['auto_vs_best']:9.3f} {r['auto_vs_eager']:10.3f} {r['tune_seconds']:7.1f} "
              f"{r['tune_fraction']:8.2%}  {r['auto_choice']}")
    if args.json:
        write_json(args.json, threads, args.steps, rows)
    return 0


def write_json(path: str, threads: int, steps: int, rows: list[dict[str, Any]]) -> None:
    Path(path).write_text(json.dumps({"threads": threads, "torch": torch.__version__, "steps": steps,
                                      "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
