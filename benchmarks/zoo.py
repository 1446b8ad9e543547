"""The benchmark model zoo: a plain PyTorch loop against hotloop's default (auto), side by side.

For each model, in ONE process and on the same model, batch and data:

- **plain**: the loop users write: eager fp32, ``optimizer.zero_grad()``, clipping when the
  hparams clip, ``loss.item()`` every step, batches read synchronously (a GAN steps its
  generator, then its discriminator, each with its own optimizer);
- **hotloop**: ``hotloop.auto_strategy`` (timed separately, reported as ``tune_seconds``),
  then the Trainer's step (``build_step``) fed by the Trainer's feeder (prefetch, workers),
  reading the loss every ``sync_every`` steps.

Both start from the same weights. Blocks of ``--block`` steps alternate (the order
rotates each round) after a warm-up block each; samples/s come from the median block.
Quality: after the run both contenders' mean loss over the last block is reported;
``loss_rel_diff`` compares them. MFU = FLOPs per step (counted by torch's FlopCounterMode)
/ step time / the measured GEMM peak at the contender's precision.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/zoo.py [--models a,b] [--json FILE] [--device cpu|cuda]

JSON: ``{"rows": [{"model", "batch", "input_size", "plain_samples_per_s",
"hotloop_samples_per_s", "speedup", "mfu", ...}], "geomean_speedup"}``.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.engine import Strategy, build_step  # noqa: E402
from hotloop.engine.flags import apply_device_flags  # noqa: E402
from hotloop.engine.program import model_phases  # noqa: E402
from hotloop.optim import build_optimizer  # noqa: E402
from hotloop.problems.base import open_reader  # noqa: E402
from hotloop.tools.hardware import detect_hardware, gemm_peak  # noqa: E402
from hotloop.tools.isolation import preserved_process_state  # noqa: E402
from hotloop.tools.model_facts import analyze_model  # noqa: E402
from hotloop.train.build import build_run  # noqa: E402
from hotloop.train.feeding import DataFeeder, to_device  # noqa: E402
from hotloop.tools.tune_budget import DEFAULT_MAX_SECONDS  # noqa: E402
from hotloop.train.plan import auto_strategy  # noqa: E402

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
MODEL_OF = {"transformer_base": "transformer"}


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


class PlainLoop:
    """The user's loop: sync feeding, zero_grad, backward, step, ``loss.item()`` each step."""

    def __init__(self, model: torch.nn.Module, run: Any, device: torch.device) -> None:
        self.model, self.device = model.train(), device
        self.feed = Endless(run.problem.reader("train", run.hp), device)
        phases = model_phases(model)
        groups = {p.name: list(p.parameters) for p in phases} if phases else {"all": list(model.parameters())}
        self.optimizers = {name: build_optimizer(params, run.hp, fused=False) for name, params in groups.items()}
        self.phased = phases is not None
        self.max_grad_norm = run.hp.max_grad_norm
        self.losses: list[float] = []

    def step(self) -> None:
        batch = self.feed.next()
        if not self.phased:
            opt = self.optimizers["all"]
            opt.zero_grad()
            loss = self.model.loss(batch).loss
            loss.backward()
            if self.max_grad_norm > 0:                  # the hparams' clipping, as users write it
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            opt.step()
            self.losses.append(loss.item())
            return
        for name, opt in self.optimizers.items():
            self.model.zero_grad(set_to_none=True)
            loss = getattr(self.model, f"{name}_loss")(batch).loss
            loss.backward()
            if self.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]],
                                               self.max_grad_norm)
            opt.step()
            if name == next(iter(self.optimizers)):
                self.losses.append(loss.item())


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


def _timed_block(loop: Any, steps: int, device: torch.device) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        loop.step()
    if isinstance(loop, HotloopLoop):
        loop.flush()                       # the block ends with everything read back
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def bench_model(name: str, rounds: int, block: int, device: torch.device, tune_seconds: float,
                log: Any) -> dict[str, Any]:
    problem, hparams, overrides = ZOO[name]
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides or None, device=device)
    first = next(iter(run.problem.reader("train", run.hp)))
    started = time.perf_counter()
    strategy = auto_strategy(copy.deepcopy(run.model), run.problem, run.hp, device, planned=10_000,
                             log=lambda line: None, max_seconds=tune_seconds, cache=False)
    tuned_s = time.perf_counter() - started
    log(f"  auto: {strategy} ({tuned_s:.1f} s)")
    plain = PlainLoop(copy.deepcopy(run.model), run, device)
    with preserved_process_state():
        apply_device_flags(strategy, device)
        fast = HotloopLoop(copy.deepcopy(run.model), run, strategy, device)
        times: dict[str, list[float]] = {"plain": [], "hotloop": []}
        loops = {"plain": plain, "hotloop": fast}
        for r in range(rounds + 1):
            order = list(loops) if r % 2 == 0 else list(reversed(loops))
            for key in order:
                seconds = _timed_block(loops[key], block, device)
                if r > 0:                                  # round 0 is the warm-up
                    times[key].append(seconds)
        fast.close()
    hw = detect_hardware(device)
    peak = gemm_peak(hw)
    facts = analyze_model(run.model, to_device(first, device))
    flops = facts.flops_per_step * max(1, run.hp.accum_steps)
    rows = _rows(first) * max(1, run.hp.accum_steps)
    plain_s, fast_s = statistics.median(times["plain"]), statistics.median(times["hotloop"])
    plain_loss = statistics.mean(plain.losses[-block:])
    fast_loss = statistics.mean(fast.losses[-block:])
    return {"model": name, "problem": problem, "hparams": hparams, "batch": rows, "input_size": _input_size(first),
            "plain_samples_per_s": rows / plain_s, "hotloop_samples_per_s": rows / fast_s,
            "speedup": plain_s / fast_s, "mfu": flops / fast_s / peak.for_precision(strategy.precision),
            "plain_mfu": flops / plain_s / peak.for_precision("fp32"),
            "strategy": {k: v for k, v in strategy.to_dict().items() if v != getattr(Strategy(), k)},
            "tune_seconds": tuned_s, "plain_loss": plain_loss, "hotloop_loss": fast_loss,
            "loss_rel_diff": abs(fast_loss - plain_loss) / max(abs(plain_loss), 1e-12),
            "steps_each": (rounds + 1) * block}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated subset")
    parser.add_argument("--rounds", type=int, default=5, help="timed blocks per contender (after one warm-up)")
    parser.add_argument("--block", type=int, default=5, help="steps per block")
    parser.add_argument("--tune-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                        help="cap on auto's tuning per model (default: hotloop's own cap)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    hw = detect_hardware(device)
    amx = "amx_bf16" in hw.cpu_bf16
    print(f"benchmarks/zoo.py: torch {torch.__version__}, {torch.get_num_threads()} threads, {hw.describe()}, "
          f"AMX {'present' if amx else 'absent'}; {args.rounds} blocks of {args.block} steps each, interleaved")
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        print(f"[{name}]", flush=True)
        row = bench_model(name, args.rounds, args.block, device, args.tune_seconds,
                          lambda line: print(line, flush=True))
        rows.append(row)
        print(f"  batch {row['batch']} x {row['input_size']}: plain {row['plain_samples_per_s']:.2f}/s, "
              f"hotloop {row['hotloop_samples_per_s']:.2f}/s -> {row['speedup']:.2f}x, MFU {row['mfu']:.1%}; "
              f"last-block loss {row['plain_loss']:.4f} vs {row['hotloop_loss']:.4f}", flush=True)
        geomean = math.exp(statistics.mean(math.log(r["speedup"]) for r in rows))
        if args.json:   # rewritten after each model: a run cut short keeps the models it finished
            Path(args.json).write_text(json.dumps({"cpu": hw.describe(), "amx": amx, "device": str(device),
                                                   "rows": rows, "geomean_speedup": geomean}, indent=2) + "\n")
    print(f"geomean speedup {geomean:.2f}x over {len(rows)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
