"""Time to BLEU on Multi30k de->en: a plain PyTorch loop and ``hotloop train``, the same wall budget each.

Both train the same model (``transformer`` with the ``transformer_multi30k`` hparams: 3+3
layers, d 256, shared 8k BPE, label smoothing 0.1, Adam with inverse-sqrt warmup, 4k-token
batches) on the same batches, one after the other, each for ``--minutes`` of wall time:

- **plain**: the loop users write: eager fp32, synchronous reading, ``zero_grad``,
  ``loss.item()`` every step, ``torch.optim.Adam`` + a ``LambdaLR`` inverse-sqrt schedule;
- **hotloop**: ``hotloop.auto_strategy`` (its tuning time counts against the budget) and the
  Trainer, without evaluation during the run.

At each ``--at`` minute mark a copy of the weights is kept (the copy's cost counts); after
both runs every copy is scored by sacreBLEU on test2016 (greedy, as the anchor recipe; the
final copies also with beam 4). Prints the CPU model and whether AMX is present.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/mt_time_to_bleu.py --minutes 30 --at 5,10,20,30 --json F
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hotloop  # noqa: E402,F401
from hotloop.decode import bleu_on_split  # noqa: E402
from hotloop.tools.hardware import detect_hardware  # noqa: E402
from hotloop.train import Callback, Event, Trainer  # noqa: E402
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.compose.plan import auto_strategy  # noqa: E402

PROBLEM, MODEL, HPARAMS = "translate_multi30k_de_en", "transformer", "transformer_multi30k"


class Snapshots:
    """Weights kept at fixed wall-clock marks (seconds since the contender's start)."""

    def __init__(self, marks_s: list[float], start: float) -> None:
        self.marks, self.start, self.kept = sorted(marks_s), start, {}

    def maybe_keep(self, model: torch.nn.Module, step: int) -> None:
        elapsed = time.perf_counter() - self.start
        while self.marks and elapsed >= self.marks[0]:
            mark = self.marks.pop(0)
            self.kept[mark] = (step, {k: v.detach().clone() for k, v in model.state_dict().items()})


def train_plain(run: Any, budget_s: float, marks_s: list[float]) -> tuple[Snapshots, int]:
    """The user's loop for ``budget_s`` seconds."""
    model, hp = copy.deepcopy(run.model).train(), run.hp
    opt = torch.optim.Adam(model.parameters(), lr=hp.learning_rate, betas=(hp.adam_beta1, hp.adam_beta2),
                           eps=hp.adam_epsilon)
    warm = hp.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, (warm / (s + 1)) ** 0.5))
    reader = run.problem.reader("train", hp)
    start = time.perf_counter()
    snaps, step, epoch = Snapshots(marks_s, start), 0, 0
    while time.perf_counter() - start < budget_s:
        reader.set_epoch(epoch)
        for batch in reader:
            logits, _ = model(batch)                                                # [B, T, V]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1),
                                   ignore_index=0, label_smoothing=hp.label_smoothing)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp.max_grad_norm)
            opt.step()
            sched.step()
            loss.item()
            step += 1
            snaps.maybe_keep(model, step)
            if time.perf_counter() - start >= budget_s:
                break
        epoch += 1
    snaps.maybe_keep(model, step)
    return snaps, step


class _Keep(Callback):
    def __init__(self, snaps: Snapshots) -> None:
        self.snaps = snaps

    def on_event(self, event: Event, trainer: Any, **info: Any) -> None:
        if event is Event.STEP_END:
            self.snaps.maybe_keep(trainer.model, trainer.step)


def train_hotloop(run: Any, budget_s: float, marks_s: list[float], out_dir: Path) -> tuple[Snapshots, int, Any]:
    """``auto_strategy`` + the Trainer for ``budget_s`` seconds in all."""
    import shutil
    shutil.rmtree(out_dir, ignore_errors=True)          # a fresh run each time
    model = copy.deepcopy(run.model)
    start = time.perf_counter()
    snaps = Snapshots(marks_s, start)
    strategy = auto_strategy(model, run.problem, run.hp, "cpu", max_time=budget_s, log=print)
    left = budget_s - (time.perf_counter() - start)
    trainer = Trainer(run.problem, model, run.hp, strategy=strategy, output_dir=out_dir, max_time=left,
                      max_epochs=10_000, eval_every=0, eval_splits=(), callbacks=[_Keep(snaps)], loggers=[],
                      run_info=run.info)     # so `hotloop eval/decode/export --output-dir` can reload the run
    trainer.fit()
    snaps.maybe_keep(trainer.model, trainer.step)
    return snaps, trainer.step, strategy


def score(run: Any, snaps: Snapshots, beam_final: bool, batches: int = 0) -> list[dict[str, Any]]:
    rows = []
    model = copy.deepcopy(run.model)
    marks = sorted(snaps.kept)
    for mark in marks:
        step, state = snaps.kept[mark]
        model.load_state_dict(state)
        greedy = bleu_on_split(model, run.problem, run.hp, "test", beam_size=1, max_batches=batches)
        row = {"minutes": mark / 60, "step": step, "bleu_greedy": greedy.score, "signature": greedy.signature}
        if beam_final and mark == marks[-1]:
            row["bleu_beam4"] = bleu_on_split(model, run.problem, run.hp, "test", beam_size=4, alpha=0.6,
                                              max_batches=batches).score
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall budget of each contender")
    parser.add_argument("--at", default="5,10,20,30", help="minute marks where the weights are kept")
    parser.add_argument("--only", choices=("both", "plain", "hotloop"), default="both")
    parser.add_argument("--out", default="runs/mt_time_to_bleu")
    parser.add_argument("--score-batches", type=int, default=0, help="score only this many 64-sentence batches")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    hw = detect_hardware()
    amx = "amx_bf16" in hw.cpu_bf16
    print(f"benchmarks/mt_time_to_bleu.py: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{hw.describe()}, AMX {'present' if amx else 'absent'}; {args.minutes} min each")
    run = build_run(PROBLEM, MODEL, HPARAMS)
    budget = args.minutes * 60
    marks = [float(m) * 60 for m in args.at.split(",") if float(m) * 60 <= budget]
    result: dict[str, Any] = {"cpu": hw.describe(), "amx": amx, "minutes": args.minutes}
    if args.only in ("both", "plain"):
        snaps, steps = train_plain(run, budget, marks)
        result["plain"] = {"steps": steps, "rows": score(run, snaps, beam_final=False, batches=args.score_batches)}
        print("plain:", json.dumps(result["plain"]), flush=True)
    if args.only in ("both", "hotloop"):
        snaps, steps, strategy = train_hotloop(run, budget, marks, Path(args.out) / "hotloop")
        result["hotloop"] = {"steps": steps, "strategy": strategy.to_dict(),
                             "rows": score(run, snaps, beam_final=True, batches=args.score_batches)}
        print("hotloop:", json.dumps(result["hotloop"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
