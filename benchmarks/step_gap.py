"""hotloop's step against the expert's at the same settings: where does a gap come from?

For one zoo model, in ONE process, on the same weights and the same batches (made once and
kept on the device, so no reader or copy is timed):

- **expert**: ``benchmarks/expert_loop.py``'s loop with :func:`expert_settings` (bf16 where the
  hardware has it, the fused update, ``channels_last`` for conv nets);
- **hotloop**: ``build_step`` under the Strategy that says the same (precision, fused update with
  torch's one-kernel optimizer, ``channels_last``), inside ``applied_strategy``;
- **hotloop_tf32** (GPU only): the same plus TF32, which the tuner adds on Ampere and later;
- **expert_no_cudnn_sdpa** (GPU only, ``--sdpa``): the expert with cuDNN's attention backend off;
- **expert_one_shape** (``--one-shape``): the expert fed one batch over and over (for models
  whose batches change shape, such as Transformer-base's token batches);
- **expert_fed** and **hotloop_fed** (``--fed``): the two read the problem's batches as the zoo
  has them read (the expert its own way, hotloop through the Trainer's feeder with the default
  prefetch); ``fed_vs_expert_fed`` pairs them, so feeding's share of a gap shows;
  **hotloop_fed_inline** (``--fed``) is hotloop's feeder reading in line (``prefetch=0``), and
  ``inline_vs_fed`` pairs it with ``hotloop_fed``: above 1, reading in line is faster.

Blocks of ``--block`` steps are interleaved in a balanced Latin square after a warm-up round;
step times are medians, ``vs_expert`` the paired per-round ratios (``zoo_stats.paired_speedup``).
The process runs with the Trainer's process settings (:func:`apply_process_settings`: the
oneDNN primitive cache, glibc keeping freed blocks mapped), as the zoo's does. Every contender's
warm-up block starts from the same weights, batches and random state, and ``first_losses``
keeps the expert's and hotloop's: in fp32 the same math gives the same losses.

    python benchmarks/step_gap.py --models bert,transformer_base --size full --device cuda --sdpa --one-shape --json F
    python benchmarks/step_gap.py --models bert --smoke                  # checks the script on a CPU
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.data import to_device  # noqa: E402
from hotloop.engine import Strategy, build_step  # noqa: E402
from hotloop.engine.process_settings import apply_process_settings  # noqa: E402
from hotloop.problems.base import open_reader  # noqa: E402
from hotloop.tools.hardware import machine_header  # noqa: E402
from hotloop.tools.isolation import applied_strategy, preserved_process_state  # noqa: E402
from expert_loop import PRECISIONS, ExpertLoop, ExpertSettings, expert_settings  # noqa: E402
from zoo import MODEL_OF, SIZES, SMOKE_DEFAULT, SMOKE_OVERRIDES  # noqa: E402
from zoo_loops import Endless, HotloopLoop, timed_block  # noqa: E402
from zoo_stats import paired_speedup, ratio_text, round_order  # noqa: E402

__all__ = ["matching_strategy", "gap_row", "main"]

Batch = dict[str, torch.Tensor]


def matching_strategy(settings: ExpertSettings, device: torch.device) -> Strategy:
    """The Strategy whose step does what the expert's loop does (no prefetch: batches are made)."""
    return Strategy(precision=settings.precision, fused_optimizer=settings.optimizer != "per-tensor",
                    fused_kernel=settings.optimizer == "fused", channels_last=settings.channels_last,
                    prefetch=0).validate(device)


class _Cycle:
    """``next()`` over a fixed list of device batches, forever."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches, self.i = batches, -1

    def __call__(self) -> Batch:
        self.i = (self.i + 1) % len(self.batches)
        return self.batches[self.i]


class _HotloopStep:
    """``build_step``'s step in the loop shape the expert has (``step`` / ``flush`` / ``losses``)."""

    def __init__(self, model: torch.nn.Module, hp: Any, strategy: Strategy, next_batch: Callable[[], Batch]) -> None:
        self.next_batch = next_batch
        self.built = build_step(model.train(), hp, strategy)
        self.pending: list[torch.Tensor] = []
        self.losses: list[float] = []

    def step(self) -> None:
        self.pending.append(self.built.step([self.next_batch()]).loss)   # the step makes its layout

    def flush(self) -> None:
        if self.pending:
            self.losses += [float(x) for x in torch.stack(self.pending).float().tolist()]
            self.pending.clear()


@contextlib.contextmanager
def _no_cudnn_sdpa() -> Any:
    previous = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(previous)


def gap_row(name: str, device: torch.device, *, size: str = "small", precision: str = "auto", rounds: int = 4,
            block: int = 8, batches: int = 4, sdpa: bool = False, one_shape: bool = False, fed: bool = False,
            smoke: bool = False) -> dict[str, Any]:
    """One model's contenders (module doc), interleaved; medians and paired ratios to the expert."""
    problem, hparams, overrides = SIZES[size][name]
    if smoke:
        overrides = ",".join(o for o in (overrides, SMOKE_OVERRIDES.get(name, SMOKE_DEFAULT)) if o)
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides or None, device=device)
    reader = iter(run.problem.reader("train", run.hp))
    made = [to_device(next(reader), device) for _ in range(batches)]
    settings = expert_settings(run.model, device, precision)
    strategy = matching_strategy(settings, device)
    loops: dict[str, Any] = {"expert": ExpertLoop(copy.deepcopy(run.model), run.hp, _Cycle(made), device, settings),
                             "hotloop": _HotloopStep(copy.deepcopy(run.model), run.hp, strategy, _Cycle(made))}
    flags: dict[str, Callable[[], Any]] = {"hotloop": lambda: applied_strategy(strategy, device)}
    if device.type == "cuda":
        tf32 = strategy.replace(tf32=True)
        loops["hotloop_tf32"] = _HotloopStep(copy.deepcopy(run.model), run.hp, tf32, _Cycle(made))
        flags["hotloop_tf32"] = lambda: applied_strategy(tf32, device)
        if sdpa:
            loops["expert_no_cudnn_sdpa"] = ExpertLoop(copy.deepcopy(run.model), run.hp, _Cycle(made), device, settings)
            flags["expert_no_cudnn_sdpa"] = _no_cudnn_sdpa
    if one_shape:
        loops["expert_one_shape"] = ExpertLoop(copy.deepcopy(run.model), run.hp, _Cycle(made[:1]), device, settings)
    feeds: list[Endless] = []
    if fed:        # both read the problem's batches as the zoo has them read: the feeding cost included
        feeds.append(Endless(open_reader(run.problem, "train", run.hp, workers=settings.data_workers), device,
                             settings.pin_memory))
        loops["expert_fed"] = ExpertLoop(copy.deepcopy(run.model), run.hp, feeds[0].next, device, settings)
        feeding = strategy.replace(prefetch=Strategy().prefetch)
        with applied_strategy(feeding, device):
            loops["hotloop_fed"] = HotloopLoop(copy.deepcopy(run.model), run, feeding, device)
        flags["hotloop_fed"] = lambda: applied_strategy(feeding, device)
        inline = strategy.replace(prefetch=0)
        with applied_strategy(inline, device):
            loops["hotloop_fed_inline"] = HotloopLoop(copy.deepcopy(run.model), run, inline, device)
        flags["hotloop_fed_inline"] = lambda: applied_strategy(inline, device)
    times: dict[str, list[float]] = {key: [] for key in loops}
    keys = list(loops)
    try:
        with preserved_process_state():
            for r in range(rounds + 1):
                for key in (keys[i] for i in round_order(len(keys), r)):
                    if r == 0:
                        torch.manual_seed(0)                   # the same dropout draws in every warm-up block
                    seconds = timed_block(loops[key], block, device, flags.get(key))
                    if r > 0:                                      # round 0 warms up
                        times[key].append(seconds)
    finally:
        for loop in loops.values():
            if isinstance(loop, HotloopLoop):
                loop.close()
        for endless in feeds:
            endless.close()
    ms = {key: 1e3 * statistics.median(ts) for key, ts in times.items()}
    first = block                                          # the warm-up block: same weights, same batches
    return {"model": name, "size": size, "problem": problem, "hparams": hparams, "overrides": overrides or "",
            "settings": {**settings.to_dict(), "optimizer": loops["expert"].optimizer_kinds},
            "strategy": {k: v for k, v in strategy.to_dict().items() if v != getattr(Strategy(), k)},
            "step_ms": ms, "vs_expert": {key: paired_speedup(times["expert"], times[key]) for key in keys
                                         if key != "expert"},
            "first_losses": {key: loops[key].losses[:first] for key in ("expert", "hotloop")},
            **({"fed_vs_expert_fed": paired_speedup(times["expert_fed"], times["hotloop_fed"]),
                "inline_vs_fed": paired_speedup(times["hotloop_fed"], times["hotloop_fed_inline"])} if fed else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert", help="comma-separated zoo models")
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: bf16 where the hardware has fast bf16; fp32: never")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--sdpa", action="store_true", help="GPU: also the expert without cuDNN attention")
    parser.add_argument("--one-shape", action="store_true", help="also the expert on one batch shape")
    parser.add_argument("--fed", action="store_true", help="also both loops reading batches as in the zoo")
    parser.add_argument("--smoke", action="store_true", help="smallest batches, 1 round of 2 steps: checks the script")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.smoke else 4)
    block = args.block or (2 if args.smoke else 8)
    device = torch.device(args.device)
    process_notes = apply_process_settings()     # as the Trainer and the zoo's tuner do: both sides share them
    machine = machine_header("benchmarks/step_gap.py")
    print(machine, flush=True)
    rows = []
    for name in args.models.split(","):
        if name not in SIZES[args.size]:
            parser.error(f"unknown model {name!r}; the zoo has {', '.join(SIZES[args.size])}")
        row = gap_row(name, device, size=args.size, precision=args.precision, rounds=rounds, block=block,
                      sdpa=args.sdpa, one_shape=args.one_shape, fed=args.fed, smoke=args.smoke)
        rows.append(row)
        print(f"[{name}] step ms: " + ", ".join(f"{k} {v:.2f}" for k, v in row["step_ms"].items())
              + "; expert time / contender's: " + ", ".join(
                  f"{k} {v['paired'] or row['step_ms']['expert'] / row['step_ms'][k]:.3f}x ({v['verdict']})"
                  for k, v in row["vs_expert"].items()), flush=True)
        if args.fed:
            print(f"[{name}] hotloop_fed time / hotloop_fed_inline's: {ratio_text(row['inline_vs_fed'])}", flush=True)
        if args.json:        # rewritten after each model: a run cut short keeps what it finished
            Path(args.json).write_text(json.dumps({"machine": machine, "device": str(device), "size": args.size,
                                                   "precision": args.precision, "threads": torch.get_num_threads(),
                                                   "process_settings": process_notes,
                                                   "rounds": rounds, "block": block, "smoke": args.smoke,
                                                   "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
