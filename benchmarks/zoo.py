"""The benchmark model zoo: the naive loop, the expert loop and hotloop's default (auto), side by side.

For each model, in ONE process and on the same model, batch and data:

- **plain** (the naive loop, ``benchmarks/expert_loop.py``): eager fp32, ``optimizer.zero_grad()``,
  clipping when the hparams clip, a per-tensor optimizer update, ``loss.item()`` every step,
  batches read synchronously (a GAN steps its generator, then its discriminator, each with
  its own optimizer);
- **expert** (``benchmarks/expert_loop.py``): the plain loop plus what a competent PyTorch user
  writes: bf16 autocast only where the hardware has fast bf16, a fused optimizer where torch has
  one (else foreach) and foreach clipping, ``channels_last`` for models with Conv2d,
  ``zero_grad(set_to_none=True)``, the loss read once per block;
- **expert_compiled** (``--compile``): the expert loop with ``torch.compile`` of the loss function;
  its first step (the compilation) is reported as ``compile_seconds``, not in the step time;
- **hotloop**: ``auto_strategy`` (timed separately, reported as ``tune_seconds``), then the
  Trainer's step (``build_step``) fed by the Trainer's feeder (prefetch, workers), reading the
  loss every ``sync_every`` steps; the strategy's process-wide flags (threads, ...) are set
  for hotloop's blocks only.

``--precision fp32`` holds every contender at fp32: the expert never autocasts and the tuner
proposes nothing below fp32 (``tune(allow_reduced_precision=False)``: no bf16, TF32 or bf16-GEMM
formulation), so the table shows what the engine gives beyond precision; ``--precision auto``
(default): the expert uses bf16 where the hardware has fast bf16 and the tuner may choose it.

All start from the same weights. Blocks of ``--block`` steps alternate (the order reverses
each round) after a warm-up block each; samples/s come from the median block. Quality: the
mean loss over each contender's last block; ``loss_rel_diff`` compares hotloop's with the
plain loop's. MFU = FLOPs per step (counted by torch's FlopCounterMode) / step time / the
measured GEMM peak at the contender's precision. ``--smoke`` checks the script, not speed:
the smallest batch of each model, one timed block of two steps, a short tuning cap.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/zoo.py [--models a,b] [--precision auto|fp32] [--compile]
        [--json FILE] [--device cpu|cuda] [--smoke]

JSON: ``{"rows": [{"model", "batch", "input_size", "plain_samples_per_s", "expert_samples_per_s",
"hotloop_samples_per_s", "speedup" (= "speedup_vs_naive"), "speedup_vs_expert", "settings",
"plain_loss", "expert_loss", "hotloop_loss", "mfu", ...}], "geomean_speedup" (= "geomean_vs_naive"),
"geomean_vs_expert", "precision", "cpu_flags", "machine"}``. Per row, ``vs_naive_paired`` and
``vs_expert_paired`` pair the contenders' blocks round by round (:func:`paired_speedup`): the
geometric mean of the per-round ratios, its 80% interval and a verdict (hotloop "faster",
"slower" or "tie" with 90% confidence); ``verdicts_vs_expert`` / ``verdicts_vs_naive`` list the
models by verdict.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable, ContextManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.engine import Strategy, build_step  # noqa: E402
from hotloop.problems.base import open_reader  # noqa: E402
from hotloop.tools.hardware import HardwareInfo, detect_hardware, gemm_peak, machine_header  # noqa: E402
from hotloop.tools.isolation import applied_strategy, preserved_process_state  # noqa: E402
from hotloop.tools.model_facts import analyze_model  # noqa: E402
from hotloop.tools.significance import compare_paired  # noqa: E402
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.data import to_device  # noqa: E402
from hotloop.train.feeding import DataFeeder  # noqa: E402
from hotloop.tools.tune_budget import DEFAULT_MAX_SECONDS  # noqa: E402
from hotloop.compose.plan import auto_strategy  # noqa: E402
from expert_loop import PRECISIONS, ExpertLoop, PlainLoop, expert_settings, plain_settings  # noqa: E402

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
MODEL_OF = {"transformer_base": "transformer"}
#: --smoke: the smallest batch of each model (checks the script; the numbers mean nothing)
SMOKE_OVERRIDES: dict[str, str] = {"transformer_base": "batch_tokens=256"}
SMOKE_DEFAULT = "batch_size=2"


def _rows(batch: dict[str, torch.Tensor]) -> int:
    return int(next(iter(batch.values())).shape[0])


def _input_size(batch: dict[str, torch.Tensor]) -> str:
    first = next(iter(batch.values()))
    return "x".join(str(d) for d in first.shape[1:])


class Endless:
    """Batches of ``reader`` forever (next epoch when one ends), on ``device``."""

    def __init__(self, reader: Any, device: torch.device) -> None:
        self.reader, self.device, self.epoch = reader, device, 0
        self.it = iter(reader)

    def next(self) -> dict[str, torch.Tensor]:
        batch = next(self.it, None)
        if batch is None:
            self.epoch += 1
            self.reader.set_epoch(self.epoch)
            self.it = iter(self.reader)
            batch = next(self.it)
        return to_device(batch, self.device)


class HotloopLoop:
    """The Trainer's step and feeder under the auto strategy; the loss is read every sync_every steps."""

    def __init__(self, model: torch.nn.Module, run: Any, strategy: Strategy, device: torch.device) -> None:
        self.strategy, self.device = strategy, device
        self.built = build_step(model.train(), run.hp, strategy)
        reader = open_reader(run.problem, "train", run.hp, workers=strategy.num_workers)
        self.feeder = DataFeeder(reader, device, strategy.prefetch)
        self.epoch = 0
        self.feeder.start_epoch(0)
        self.pending: list[torch.Tensor] = []
        self.losses: list[float] = []
        self.accum = max(1, run.hp.accum_steps)

    def step(self) -> None:
        batches = self.feeder.next_step(self.accum)
        if batches is None:
            self.feeder.finish_epoch()
            self.epoch += 1
            self.feeder.start_epoch(self.epoch)
            batches = self.feeder.next_step(self.accum)
        result = self.built.step(batches)
        self.pending.append(result.loss)
        if len(self.pending) >= self.strategy.sync_every:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.losses += [float(x) for x in torch.stack(self.pending).tolist()]
            self.pending.clear()

    def close(self) -> None:
        self.feeder.close()


def _timed_block(loop: Any, steps: int, device: torch.device,
                 flags: Callable[[], ContextManager[None]] | None = None) -> float:
    """Seconds per step of ``steps`` steps, the block's losses read back at its end."""
    with flags() if flags else contextlib.nullcontext():
        start = time.perf_counter()
        for _ in range(steps):
            loop.step()
        loop.flush()                       # the block ends with everything read back
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / steps


def cpu_flags(hw: HardwareInfo) -> dict[str, Any]:
    """The machine's usable instruction sets, the caps in force and fast-bf16 flags (or the GPU)."""
    return {"isa": list(hw.cpu_isa), "caps": list(hw.cpu_caps), "fast_bf16_flags": list(hw.cpu_bf16),
            "cpu_model": hw.cpu_model, **({"gpu": hw.cuda_name} if hw.device == "cuda" else {})}


def paired_speedup(reference: list[float], contender: list[float]) -> dict[str, Any]:
    """``reference`` block time / ``contender``'s, paired by round (one block each per round, so a
    round's load hits both): the geometric mean of the per-round ratios, its two-sided 80% interval
    (each bound a one-sided 90% bound) and the verdict "faster" (the contender, with 90% confidence),
    "slower" or "tie"; "unpaired" with fewer than three rounds."""
    rounds = list(range(min(len(reference), len(contender))))
    c = compare_paired(contender[:len(rounds)], rounds, reference[:len(rounds)], rounds)
    if not c.paired:
        return {"paired": None, "interval90": None, "verdict": "unpaired", "pairs": c.pairs}
    low, high = 1 / c.upper, 1 / c.lower       # bounds of the time ratio, turned into speed-ups
    verdict = "faster" if low > 1 else "slower" if high < 1 else "tie"
    return {"paired": 1 / c.ratio, "interval90": [low, high], "verdict": verdict, "pairs": c.pairs}


def _last_block(losses: list[float], block: int) -> float:
    return statistics.mean(losses[-block:])


def bench_model(name: str, rounds: int, block: int, device: torch.device, tune_seconds: float,
                log: Any, *, precision: str = "auto", compile: bool = False,
                overrides: str | None = None, size: str = "small") -> dict[str, Any]:
    """One zoo row: every contender on ``name``'s model, interleaved blocks, medians."""
    problem, hparams, zoo_overrides = SIZES[size][name]
    overrides = ",".join(o for o in (zoo_overrides, overrides) if o) or None
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides, device=device)
    first = next(iter(run.problem.reader("train", run.hp)))
    started = time.perf_counter()
    strategy = auto_strategy(copy.deepcopy(run.model), run.problem, run.hp, device, planned=10_000,
                             log=lambda line: None, max_seconds=tune_seconds, cache=False,
                             allow_reduced_precision=precision != "fp32")
    tuned_s = time.perf_counter() - started
    log(f"  auto: {strategy} ({tuned_s:.1f} s)")

    def feed() -> Callable[[], dict[str, torch.Tensor]]:
        return Endless(run.problem.reader("train", run.hp), device).next

    settings = expert_settings(run.model, device, precision)
    loops: dict[str, Any] = {"plain": PlainLoop(copy.deepcopy(run.model), run.hp, feed()),
                             "expert": ExpertLoop(copy.deepcopy(run.model), run.hp, feed(), device, settings)}
    if compile:
        loops["expert_compiled"] = ExpertLoop(copy.deepcopy(run.model), run.hp, feed(), device,
                                              replace(settings, compile=True))
    times: dict[str, list[float]] = {}
    with preserved_process_state():
        with applied_strategy(strategy, device):
            loops["hotloop"] = fast = HotloopLoop(copy.deepcopy(run.model), run, strategy, device)
        flags = {"hotloop": lambda: applied_strategy(strategy, device)}
        times = {key: [] for key in loops}
        for r in range(rounds + 1):
            order = list(loops) if r % 2 == 0 else list(reversed(loops))
            for key in order:
                seconds = _timed_block(loops[key], block, device, flags.get(key))
                if r > 0:                                  # round 0 is the warm-up (and the compile)
                    times[key].append(seconds)
        fast.close()
    hw = detect_hardware(device)
    peak = gemm_peak(hw)
    facts = analyze_model(run.model, to_device(first, device))
    flops = facts.flops_per_step * max(1, run.hp.accum_steps)
    rows = _rows(first) * max(1, run.hp.accum_steps)
    sec = {key: statistics.median(ts) for key, ts in times.items()}
    loss = {key: _last_block(loop.losses, block) for key, loop in loops.items()}
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
        "settings": {"plain": plain_settings(),
                     "expert": {**settings.to_dict(), "optimizer": expert.optimizer_kinds},
                     "hotloop": {"strategy": changed, "precision": strategy.precision,
                                 "fused_optimizer": strategy.fused_optimizer,
                                 "channels_last": strategy.channels_last,
                                 "loss_read": f"every {strategy.sync_every} steps"}},
        **{f"{key}_loss": value for key, value in loss.items()},
        "loss_rel_diff": abs(loss["hotloop"] - loss["plain"]) / max(abs(loss["plain"]), 1e-12),
        "expert_loss_rel_diff": abs(loss["expert"] - loss["plain"]) / max(abs(loss["plain"]), 1e-12),
        "steps_each": (rounds + 1) * block}
    if compile:
        compiled = loops["expert_compiled"]
        row["settings"]["expert_compiled"] = {**compiled.settings.to_dict(), "optimizer": compiled.optimizer_kinds}
        row.update(speedup_vs_expert_compiled=sec["expert_compiled"] / sec["hotloop"],
                   compile_seconds=compiled.compile_seconds)
    return row


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def _interval(paired: dict[str, Any]) -> str:
    if paired["interval90"] is None:
        return "unpaired"
    low, high = paired["interval90"]
    return f"{low:.2f}-{high:.2f}x {paired['verdict']}"


def verdicts(rows: list[dict[str, Any]], key: str) -> dict[str, list[str]]:
    """Models by verdict of ``key`` (``vs_expert_paired`` or ``vs_naive_paired``)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r[key]["verdict"], []).append(r["model"])
    return out


def print_table(rows: list[dict[str, Any]], compiled: bool) -> None:
    """The naive, expert (and compiled) and hotloop columns, samples/s, with hotloop's ratios."""
    head = f"{'model':18s} {'naive/s':>9s} {'expert/s':>9s} " + (f"{'compiled/s':>10s} " if compiled else "")
    print(head + f"{'hotloop/s':>9s} {'vs naive':>9s} {'vs expert':>9s}" + (f" {'vs comp.':>9s}" if compiled else "")
          + f" {'vs expert, 80% interval':>24s}  last-block loss naive / expert / hotloop")
    for r in rows:
        line = f"{r['model']:18s} {r['plain_samples_per_s']:9.2f} {r['expert_samples_per_s']:9.2f} "
        has = "expert_compiled_samples_per_s" in r
        if compiled:
            line += f"{r['expert_compiled_samples_per_s']:10.2f} " if has else f"{'-':>10s} "
        line += f"{r['hotloop_samples_per_s']:9.2f} {r['speedup_vs_naive']:8.2f}x {r['speedup_vs_expert']:8.2f}x"
        if compiled:
            line += f" {r['speedup_vs_expert_compiled']:8.2f}x" if has else f" {'-':>9s}"
        losses = f"{r['plain_loss']:.4f} / {r['expert_loss']:.4f} / {r['hotloop_loss']:.4f}"
        print(line + f" {_interval(r['vs_expert_paired']):>24s}  {losses}")


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
    parser.add_argument("--compile", action="store_true",
                        help="also time expert_compiled (torch.compile of the loss; compile time apart)")
    parser.add_argument("--compile-models", default=None, metavar="A,B",
                        help="with --compile: only these models get the compiled contender (default: all)")
    parser.add_argument("--size", choices=tuple(SIZES), default="small",
                        help="small: the CPU configurations; full: published sizes and real input shapes")
    parser.add_argument("--smoke", action="store_true", help="smallest batch of each model, 1 block of 2 "
                        "steps: checks the script, measures nothing")
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
                          overrides=smoke, size=args.size)
        rows.append(row)
        print(f"  batch {row['batch']} x {row['input_size']}: plain {row['plain_samples_per_s']:.2f}/s, "
              f"expert {row['expert_samples_per_s']:.2f}/s, hotloop {row['hotloop_samples_per_s']:.2f}/s -> "
              f"{row['speedup_vs_naive']:.2f}x naive, {row['speedup_vs_expert']:.2f}x expert, MFU {row['mfu']:.1%}; "
              f"last-block loss {row['plain_loss']:.4f} / {row['expert_loss']:.4f} / {row['hotloop_loss']:.4f}",
              flush=True)
        top = {"geomean_vs_naive": geomean([r["speedup_vs_naive"] for r in rows]),
               "geomean_vs_expert": geomean([r["speedup_vs_expert"] for r in rows]),
               "verdicts_vs_expert": verdicts(rows, "vs_expert_paired"),
               "verdicts_vs_naive": verdicts(rows, "vs_naive_paired")}
        with_compiled = [r["speedup_vs_expert_compiled"] for r in rows if "speedup_vs_expert_compiled" in r]
        if with_compiled:
            top["geomean_vs_expert_compiled"] = geomean(with_compiled)
        if args.json:   # rewritten after each model: a run cut short keeps the models it finished
            Path(args.json).write_text(json.dumps(
                {"cpu": hw.describe(), "amx": amx, "device": str(device), "machine": machine,
                 "precision": args.precision, "cpu_flags": cpu_flags(hw), "smoke": args.smoke, "size": args.size,
                 "rounds": rounds, "block": block, "rows": rows,
                 "geomean_speedup": top["geomean_vs_naive"], **top}, indent=2) + "\n")
    print()
    print_table(rows, bool(with_compiled))
    print(f"geomean over {len(rows)} models: {top['geomean_vs_naive']:.2f}x the naive loop, "
          f"{top['geomean_vs_expert']:.2f}x the expert loop"
          + (f", {top['geomean_vs_expert_compiled']:.2f}x the compiled expert" if with_compiled else "")
          + f" (precision {args.precision})")
    print("against the expert loop, with 90% confidence per row: "
          + "; ".join(f"{v}: {', '.join(m)}" for v, m in sorted(top["verdicts_vs_expert"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
