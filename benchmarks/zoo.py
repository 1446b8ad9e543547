"""The benchmark model zoo: the naive loop, the expert loop and hotloop's default (auto), side by side.

For each model, in ONE process and on the same model, batch and data:

- **plain** (the naive loop, ``benchmarks/expert_loop.py``): eager fp32, ``optimizer.zero_grad()``,
  clipping when the hparams clip, a per-tensor optimizer update, ``loss.item()`` every step,
  batches read synchronously (a GAN steps its generator, then its discriminator, each with
  its own optimizer);
- **expert** (``benchmarks/expert_loop.py``): the plain loop plus what a competent PyTorch user
  writes: bf16 autocast only where the hardware has fast bf16, a fused optimizer where torch has
  one (else foreach) and foreach clipping, ``channels_last`` for models with Conv2d,
  ``zero_grad(set_to_none=True)``, the loss read once per block; on a GPU its batches come from
  4 reader worker processes through pinned memory (on a CPU, from the training thread);
- **expert_compiled** (``--compile``): the expert loop with ``torch.compile`` of the loss function;
  its first step (the compilation) is reported as ``compile_seconds``, not in the step time;
- **expert_twin** (``--control``): a second expert loop, its starting weights moved by about one
  fp32 ulp (:func:`hotloop.tools.trajectory.perturb_weights`); its time ratio to the expert
  (``control_vs_expert``, ``control_paired``) is what the table gives for no difference at all, and
  its loss's relative difference from the expert's (``control_loss_rel_diff``) is what rounding alone
  moves the loss by over the run (the chaos floor at this length); ``--control`` also trains
  **plain_twin**, the naive loop from the same one-ulp-moved weights, untimed, for
  ``naive_floor_rel_diff``: the same floor for the comparison with the naive loop;
- **hotloop**: ``auto_strategy`` (timed separately: ``tune_seconds``, and ``tune_share`` of a
  10,000-step run; ``--strategy K=V,...``: that Strategy instead, untuned, after the process
  settings the tuner makes), then the Trainer's step (``build_step``) fed by the Trainer's feeder
  (prefetch, workers), reading the loss every ``sync_every`` steps; the strategy's process-wide
  flags (threads, ...) are set for hotloop's blocks only.

``--precision fp32`` holds every contender at fp32: the expert never autocasts and the tuner
proposes nothing below fp32 (``tune(allow_reduced_precision=False)``: no bf16, TF32 or bf16-GEMM
formulation), so the table shows what the engine gives beyond precision; ``--precision auto``
(default): the expert uses bf16 where the hardware has fast bf16 and the tuner may choose it.

All start from the same weights. Blocks of ``--block`` steps are interleaved after a warm-up
block each, in the orders of a balanced Latin square (:func:`zoo_stats.round_order`: every
contender in every position and after every other equally often); samples/s come from the median block. Quality: the
mean loss over each contender's last ``--quality-window`` steps (default: one block) once each has
taken ``--quality-steps`` steps (default: the timed ones; further steps run untimed after the
timing, ``benchmarks/zoo_loops.py``); ``loss_rel_diff`` compares hotloop's with the plain loop's.
MFU = FLOPs per step (counted by torch's FlopCounterMode) / step time / the
measured GEMM peak at the contender's precision. ``--smoke`` checks the script, not speed:
the smallest batch of each model, one timed block of two steps, a short tuning cap. The
tuner's report (its table of trials) is printed under each model's ``auto:`` line.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/zoo.py [--models a,b] [--precision auto|fp32] [--compile] [--control]
        [--quality-steps N] [--quality-window K] [--json FILE] [--device cpu|cuda] [--smoke]

JSON: ``{"rows": [{"model", "batch", "input_size", "plain_samples_per_s", "expert_samples_per_s",
"hotloop_samples_per_s", "speedup" (= "speedup_vs_naive"), "speedup_vs_expert", "settings",
"plain_loss", "expert_loss", "hotloop_loss", "mfu", ...}], "geomean_speedup" (= "geomean_vs_naive"),
"geomean_vs_expert", "precision", "cpu_flags", "machine"}``. Per row, ``vs_naive_paired`` and
``vs_expert_paired`` pair the contenders' blocks round by round (:func:`paired_speedup`): the
geometric mean of the per-round ratios, its 80% interval and a verdict (hotloop "faster",
"slower" or "tie" with 90% confidence); ``verdicts_vs_expert`` / ``verdicts_vs_naive`` list the
models by verdict; ``familywise_vs_expert`` reads the table as one claim
(:func:`zoo_stats.familywise`: each bound widened so that seven tied rows show a false "slower"
one table in ten, not one in two); with ``--control``, ``geomean_control``, ``verdicts_control``
and ``familywise_control`` do the same for the twin.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.engine import Strategy  # noqa: E402
from hotloop.engine.process_settings import apply_process_settings  # noqa: E402
from hotloop.problems.base import open_reader  # noqa: E402
from hotloop.tools.hardware import detect_hardware, gemm_peak, machine_header  # noqa: E402
from hotloop.tools.isolation import applied_strategy, preserved_process_state  # noqa: E402
from hotloop.tools.model_facts import analyze_model  # noqa: E402
from hotloop.tools.trajectory import perturb_weights  # noqa: E402
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.data import to_device  # noqa: E402
from hotloop.tools.tune_budget import DEFAULT_MAX_SECONDS  # noqa: E402
from hotloop.compose.plan import auto_strategy  # noqa: E402
from expert_loop import PRECISIONS, ExpertLoop, PlainLoop, expert_settings, plain_settings  # noqa: E402
from zoo_loops import Endless, HotloopLoop, timed_block, train_untimed, window_loss  # noqa: E402,F401
from zoo_stats import (cpu_flags, familywise, familywise_text, geomean, paired_speedup, print_table,  # noqa: E402,F401
                       round_order, verdict_text, verdicts)

# model -> (problem, hparams set, overrides): the small CPU configurations; the same for both contenders
ZOO: dict[str, tuple[str, str, str]] = {
    "se_resnext50": ("image_mnist", "se_resnext_small", ""),
    "deeplabv3plus": ("segment_shapes", "deeplabv3plus_small", ""),
    "cyclegan": ("shapes_unpaired", "cyclegan_small", ""),
    "bert": ("bert_pretrain_ptb", "bert_small", ""),
    "transformer_base": ("translate_multi30k_de_en", "transformer_base_small", ""),
    "yolov3": ("detection_shapes", "yolov3_shapes", ""),
    "mask_rcnn": ("detection_shapes", "mask_rcnn_shapes", ""),
}
# --size full: the seven models at their published sizes and real input shapes, on synthetic data
# (or PTB / Multi30k), for --device cuda; the CPU table keeps the small configurations
ZOO_FULL: dict[str, tuple[str, str, str]] = {
    "se_resnext50": ("image_synthetic", "se_resnext50_imagenet", ""),        # ImageNet 224 px, 1000 classes
    "deeplabv3plus": ("segment_shapes", "deeplabv3plus_r50", ""),            # 513 px crops (VOC / Cityscapes)
    "cyclegan": ("shapes_unpaired", "cyclegan_256", ""),                     # 256 px, batch 1
    "bert": ("bert_pretrain_ptb", "bert_base", ""),                          # BERT-base, sequence 128
    "transformer_base": ("translate_multi30k_de_en", "transformer_base", ""),  # 4096-token batches (T2T's)
    "yolov3": ("detection_shapes", "yolov3_base", ""),                       # 416 px
    "mask_rcnn": ("detection_shapes", "mask_rcnn_base", "batch_size=4"),     # 800 px
}
SIZES = {"small": ZOO, "full": ZOO_FULL}
#: the run the tuner plans for; ``tune_share`` is tuning's part of tuning plus that run at hotloop's step
PLANNED_STEPS = 10_000
MODEL_OF = {"transformer_base": "transformer"}
#: --smoke: the smallest batch of each model (checks the script; the numbers mean nothing)
SMOKE_OVERRIDES: dict[str, str] = {"transformer_base": "batch_tokens=256"}
SMOKE_DEFAULT = "batch_size=2"


def _rows(batch: dict[str, torch.Tensor]) -> int:
    return int(next(iter(batch.values())).shape[0])


def _input_size(batch: dict[str, torch.Tensor]) -> str:
    first = next(iter(batch.values()))
    return "x".join(str(d) for d in first.shape[1:])


def _rel_diff(value: float, reference: float) -> float:
    return abs(value - reference) / max(abs(reference), 1e-12)


def _one_ulp_away(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with its weights moved by about one fp32 ulp (the A/A twins' start)."""
    twin = copy.deepcopy(model)
    perturb_weights(twin, "fp32")
    return twin


def bench_model(name: str, rounds: int, block: int, device: torch.device, tune_seconds: float,
                log: Any, *, precision: str = "auto", compile: bool = False,
                overrides: str | None = None, size: str = "small", control: bool = False,
                compile_tune_seconds: float | None = None, fixed: Strategy | None = None,
                quality_steps: int = 0, quality_window: int | None = None) -> dict[str, Any]:
    """One zoo row: every contender on ``name``'s model, interleaved blocks, medians (hotloop under
    ``fixed`` when given, else under ``auto_strategy``); each contender's loss is the mean over its
    last ``quality_window`` steps (default: one block) once it has taken ``quality_steps`` steps
    (default and at least: the timed ones; the rest untimed)."""
    steps_each = (rounds + 1) * block
    horizon = max(steps_each, quality_steps)
    window = min(quality_window or block, horizon)
    problem, hparams, zoo_overrides = SIZES[size][name]
    overrides = ",".join(o for o in (zoo_overrides, overrides) if o) or None
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides, device=device)
    first = next(iter(run.problem.reader("train", run.hp)))
    started = time.perf_counter()
    if fixed is not None:
        apply_process_settings()          # the process settings the tuner would have made
        strategy = fixed.validate(device)
    else:
        strategy = auto_strategy(copy.deepcopy(run.model), run.problem, run.hp, device, planned=PLANNED_STEPS,
                                 log=lambda line: log(f"    tune: {line}"), max_seconds=tune_seconds, cache=False,
                                 **({} if compile_tune_seconds is None else
                                    {"compile_max_seconds": compile_tune_seconds}),
                                 allow_reduced_precision=precision != "fp32")
    tuned_s = time.perf_counter() - started
    log(f"  auto: {strategy} ({tuned_s:.1f} s)")

    settings = expert_settings(run.model, device, precision)

    feeds: list[Endless] = []

    def feed(workers: int = 0, pin: bool = False) -> Callable[[], dict[str, torch.Tensor]]:
        feeds.append(Endless(open_reader(run.problem, "train", run.hp, workers=workers), device, pin))
        return feeds[-1].next

    expert_feed = {"workers": settings.data_workers, "pin": settings.pin_memory}
    loops: dict[str, Any] = {"plain": PlainLoop(copy.deepcopy(run.model), run.hp, feed()),
                             "expert": ExpertLoop(copy.deepcopy(run.model), run.hp, feed(**expert_feed), device,
                                                  settings)}
    if compile:
        loops["expert_compiled"] = ExpertLoop(copy.deepcopy(run.model), run.hp, feed(**expert_feed), device,
                                              replace(settings, compile=True))
    times: dict[str, list[float]] = {}
    with preserved_process_state():
        with applied_strategy(strategy, device):
            loops["hotloop"] = fast = HotloopLoop(copy.deepcopy(run.model), run, strategy, device)
        if control:       # an A/A pair: the expert again, from weights moved by one ulp, timed like any contender
            loops["expert_twin"] = ExpertLoop(_one_ulp_away(run.model), run.hp, feed(**expert_feed), device, settings)
        flags = {"hotloop": lambda: applied_strategy(strategy, device)}
        times = {key: [] for key in loops}
        keys = list(loops)
        for r in range(rounds + 1):
            for key in (keys[i] for i in round_order(len(keys), r)):
                seconds = timed_block(loops[key], block, device, flags.get(key))
                if r > 0:                                  # round 0 is the warm-up (and the compile)
                    times[key].append(seconds)
        for key, loop in loops.items():                    # on to the quality horizon, untimed
            train_untimed(loop, horizon - steps_each, flags.get(key))
        if control:   # the naive loop from weights one ulp away: how far rounding alone moves the naive loss
            loops["plain_twin"] = PlainLoop(_one_ulp_away(run.model), run.hp, feed())
            train_untimed(loops["plain_twin"], horizon)
        fast.close()
        for endless in feeds:
            endless.close()
    hw = detect_hardware(device)
    peak = gemm_peak(hw)
    facts = analyze_model(run.model, to_device(first, device))
    flops = facts.flops_per_step * max(1, run.hp.accum_steps)
    rows = _rows(first) * max(1, run.hp.accum_steps)
    sec = {key: statistics.median(ts) for key, ts in times.items()}
    loss = {key: window_loss(loop.losses, window) for key, loop in loops.items()}
    expert = loops["expert"]
    changed = {k: v for k, v in strategy.to_dict().items() if v != getattr(Strategy(), k)}
    row: dict[str, Any] = {
        "model": name, "size": size, "problem": problem, "hparams": hparams, "overrides": overrides or "", "batch": rows,
        "input_size": _input_size(first),
        **{f"{key}_samples_per_s": rows / s for key, s in sec.items()},
        "speedup": sec["plain"] / sec["hotloop"], "speedup_vs_naive": sec["plain"] / sec["hotloop"],
        "speedup_vs_expert": sec["expert"] / sec["hotloop"],
        "vs_naive_paired": paired_speedup(times["plain"], times["hotloop"]),
        "vs_expert_paired": paired_speedup(times["expert"], times["hotloop"]),
        "expert_vs_naive": sec["plain"] / sec["expert"],
        "mfu": flops / sec["hotloop"] / peak.for_precision(strategy.precision),
        "plain_mfu": flops / sec["plain"] / peak.for_precision("fp32"),
        "expert_mfu": flops / sec["expert"] / peak.for_precision(settings.precision),
        "strategy": changed, "tune_seconds": tuned_s,
        "tune_share": tuned_s / (tuned_s + PLANNED_STEPS * sec["hotloop"]),
        "settings": {"plain": plain_settings(),
                     "expert": {**settings.to_dict(), "optimizer": expert.optimizer_kinds},
                     "hotloop": {"strategy": changed, "precision": strategy.precision,
                                 "fused_optimizer": strategy.fused_optimizer,
                                 "channels_last": strategy.channels_last, "prefetch": strategy.prefetch,
                                 "loss_read": f"every {strategy.sync_every} steps"}},
        **{f"{key}_loss": value for key, value in loss.items()},
        "loss_rel_diff": _rel_diff(loss["hotloop"], loss["plain"]),
        "expert_loss_rel_diff": _rel_diff(loss["expert"], loss["plain"]),
        "steps_each": steps_each, "quality_steps": horizon, "quality_window": window}
    if control:
        row.update(naive_floor_rel_diff=_rel_diff(loss["plain_twin"], loss["plain"]),
                   control_vs_expert=sec["expert"] / sec["expert_twin"],
                   control_paired=paired_speedup(times["expert"], times["expert_twin"]),
                   control_loss_rel_diff=_rel_diff(loss["expert_twin"], loss["expert"]))
    if compile:
        compiled = loops["expert_compiled"]
        row["settings"]["expert_compiled"] = {**compiled.settings.to_dict(), "optimizer": compiled.optimizer_kinds}
        row.update(speedup_vs_expert_compiled=sec["expert_compiled"] / sec["hotloop"],
                   compile_seconds=compiled.compile_seconds)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated subset")
    parser.add_argument("--rounds", type=int, default=None, help="timed blocks per contender (after one "
                        "warm-up; default 5, --smoke 1)")
    parser.add_argument("--block", type=int, default=None, help="steps per block (default 5, --smoke 2)")
    parser.add_argument("--tune-seconds", type=float, default=None,
                        help="cap on auto's tuning per model (default: hotloop's own cap; --smoke 2)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: bf16 where the hardware has fast bf16 (expert and tuner); fp32: every "
                        "contender at fp32")
    parser.add_argument("--compile-tune-seconds", type=float, default=None,
                        help="cap on tuning when a compile is proposed (default: the tuner's own, "
                             "hotloop.tools.tune_budget.COMPILE_MAX_SECONDS)")
    parser.add_argument("--compile", action="store_true",
                        help="also time expert_compiled (torch.compile of the loss; compile time apart)")
    parser.add_argument("--compile-models", default=None, metavar="A,B",
                        help="with --compile: only these models get the compiled contender (default: all)")
    parser.add_argument("--control", action="store_true",
                        help="also time expert_twin, a second expert loop: its ratio to the expert is the "
                        "table's own noise (an A/A comparison)")
    parser.add_argument("--quality-steps", type=int, default=0, metavar="N",
                        help="compare losses after N steps of each contender (the timed ones, then untimed "
                             "ones; default: the timed ones)")
    parser.add_argument("--quality-window", type=int, default=None, metavar="K",
                        help="the loss compared: the mean over each contender's last K steps (default: one block)")
    parser.add_argument("--size", choices=tuple(SIZES), default="small",
                        help="small: the CPU configurations; full: published sizes and real input shapes")
    parser.add_argument("--smoke", action="store_true", help="smallest batch of each model, 1 block of 2 "
                        "steps: checks the script, measures nothing")
    parser.add_argument("--strategy", default=None, metavar="K=V,...",
                        help="time hotloop under this Strategy (Strategy() with these fields) instead of auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.smoke else 5)
    block = args.block if args.block is not None else (2 if args.smoke else 5)
    tune_s = args.tune_seconds if args.tune_seconds is not None else (2.0 if args.smoke else DEFAULT_MAX_SECONDS)
    device = torch.device(args.device)
    hw = detect_hardware(device)
    amx = "amx_bf16" in hw.cpu_bf16
    machine = machine_header("benchmarks/zoo.py")
    print(machine)
    print(f"benchmarks/zoo.py: torch {torch.__version__}, {torch.get_num_threads()} threads, {hw.describe()}, "
          f"AMX {'present' if amx else 'absent'}; precision {args.precision}; {rounds} blocks of {block} "
          f"steps each, interleaved{' (SMOKE: not a measurement)' if args.smoke else ''}")
    rows: list[dict[str, Any]] = []
    names = args.models.split(",")
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; the zoo has {', '.join(ZOO)}")
    compiled = set(args.compile_models.split(",")) if args.compile_models else set(names)
    for name in names:
        print(f"[{name}]", flush=True)
        smoke = SMOKE_OVERRIDES.get(name, SMOKE_DEFAULT) if args.smoke else None
        row = bench_model(name, rounds, block, device, tune_s, lambda line: print(line, flush=True),
                          precision=args.precision, compile=args.compile and name in compiled,
                          overrides=smoke, size=args.size, control=args.control,
                          compile_tune_seconds=args.compile_tune_seconds,
                          fixed=Strategy.parse(args.strategy) if args.strategy else None,
                          quality_steps=args.quality_steps, quality_window=args.quality_window)
        rows.append(row)
        print(f"  batch {row['batch']} x {row['input_size']}: plain {row['plain_samples_per_s']:.2f}/s, "
              f"expert {row['expert_samples_per_s']:.2f}/s, hotloop {row['hotloop_samples_per_s']:.2f}/s -> "
              f"{row['speedup_vs_naive']:.2f}x naive, {row['speedup_vs_expert']:.2f}x expert, MFU {row['mfu']:.1%}; "
              f"loss (last {row['quality_window']} of {row['quality_steps']} steps) {row['plain_loss']:.4f} / "
              f"{row['expert_loss']:.4f} / {row['hotloop_loss']:.4f}, hotloop {row['loss_rel_diff']:.2%} from naive"
              + (f" (the naive loop from one-ulp-moved weights: {row['naive_floor_rel_diff']:.2%})"
                 if args.control else ""), flush=True)
        top = {"geomean_vs_naive": geomean([r["speedup_vs_naive"] for r in rows]),
               "geomean_vs_expert": geomean([r["speedup_vs_expert"] for r in rows]),
               "verdicts_vs_expert": verdicts(rows, "vs_expert_paired"),
               "verdicts_vs_naive": verdicts(rows, "vs_naive_paired"),
               "familywise_vs_expert": familywise(rows, "vs_expert_paired")}
        if args.control:
            top.update(geomean_control=geomean([r["control_vs_expert"] for r in rows]),
                       verdicts_control=verdicts(rows, "control_paired"),
                       familywise_control=familywise(rows, "control_paired"))
        with_compiled = [r["speedup_vs_expert_compiled"] for r in rows if "speedup_vs_expert_compiled" in r]
        if with_compiled:
            top["geomean_vs_expert_compiled"] = geomean(with_compiled)
        if args.json:   # rewritten after each model: a run cut short keeps the models it finished
            Path(args.json).write_text(json.dumps(
                {"cpu": hw.describe(), "amx": amx, "device": str(device), "machine": machine,
                 "precision": args.precision, "cpu_flags": cpu_flags(hw), "smoke": args.smoke, "size": args.size,
                 "rounds": rounds, "block": block, "tune_cap_s": tune_s, "fixed_strategy": args.strategy,
                 "compile_tune_cap_s": args.compile_tune_seconds, "rows": rows,
                 "geomean_speedup": top["geomean_vs_naive"], **top}, indent=2) + "\n")
    print()
    print_table(rows, bool(with_compiled))
    print(f"geomean over {len(rows)} models: {top['geomean_vs_naive']:.2f}x the naive loop, "
          f"{top['geomean_vs_expert']:.2f}x the expert loop"
          + (f", {top['geomean_vs_expert_compiled']:.2f}x the compiled expert" if with_compiled else "")
          + f" (precision {args.precision})")
    print("against the expert loop, with 90% confidence per row: "
          + verdict_text(top["verdicts_vs_expert"]))
    print(familywise_text(top["familywise_vs_expert"], "the expert loop"))
    if args.control:
        print(f"control (a second expert loop against the first): geomean {top['geomean_control']:.3f}x; per row: "
              + verdict_text(top["verdicts_control"]))
        print(familywise_text(top["familywise_control"], "the expert loop, control"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
