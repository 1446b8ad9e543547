"""Fine-tuning the published all-MiniLM-L6-v2 against training the same BERT from scratch.

Task: ``ptb_next_sentence`` (does PTB sentence B follow sentence A in the Wall Street Journal
text, or is it a random sentence of the same split; labels from the corpus order, 50/50, see
:mod:`hotloop.problems.next_sentence`). Both runs train hotloop's ``bert`` with all-MiniLM-L6-v2's
shape (``bert_minilm_l6``: 6 layers, 384 wide, the 30,522-piece vocabulary) for the same
``--steps`` at the same batch size, AdamW with weight decay 0.01 (none on biases and norms),
10% warmup then cosine decay, from the same seed; they differ only in the initial weights
(``--init-from`` the packaged checkpoint, or BERT's random init) and the peak learning rate
(``--lr-pretrained``, ``--lr-scratch``: each the usual choice for its start). Every
``--eval-every`` steps both are scored on the same ``--eval-examples`` valid pairs; at the end
on ``--test-batches`` batches of test pairs.

    PYTHONPATH=. python benchmarks/finetune.py [--steps 150] [--pooling mean|cls] [--parallel --threads 1] [--json FILE]
    PYTHONPATH=. python benchmarks/finetune.py --smoke      # checks the script; the numbers mean nothing

Reported: both accuracy curves (step 0: before training); ``target``, the best valid accuracy
the scratch run reaches after step 0; the first step each run reaches it, and each of
0.55-0.80; the final test accuracies. A quality run,
not a timing run: the curves are in steps.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hotloop.engine import Strategy  # noqa: E402
from hotloop.models.bert import BERT, bert_minilm_l6  # noqa: E402
from hotloop.problems.next_sentence import PTBNextSentence, default_tokenizer_path  # noqa: E402
from hotloop.tools.hardware import detect_hardware  # noqa: E402
from hotloop.train import Trainer  # noqa: E402
from hotloop.train.events import Callback, Event  # noqa: E402

__all__ = ["main", "run_one", "first_step_reaching"]


class _Curve(Callback):
    """Records ``(step, valid accuracy, valid loss)`` at every evaluation of the valid split."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.points: list[dict[str, float]] = []

    def on_event(self, event: Event, trainer: Any, **info: Any) -> None:
        if event is Event.EVAL_END and info.get("split") == "valid":
            m = info["metrics"]
            self.points.append({"step": trainer.step, "accuracy": m["accuracy"], "loss": m["loss"]})
            print(f"  {self.name} step {trainer.step:4d}: valid accuracy {m['accuracy']:.4f} "
                  f"loss {m['loss']:.4f}", flush=True)


def run_one(problem: PTBNextSentence, args: argparse.Namespace, pretrained: bool) -> dict[str, Any]:
    """One run (pretrained or scratch); its curve (step 0 included) and final test metrics."""
    lr = args.lr_pretrained if pretrained else args.lr_scratch
    hp = bert_minilm_l6().replace(batch_size=args.batch_size, max_length=args.max_length, max_steps=args.steps,
                                  warmup_steps=max(1, args.steps // 10), learning_rate=lr,
                                  classifier_pooling=args.pooling)
    torch.manual_seed(hp.seed)
    model = BERT(hp, problem.spec(hp))
    curve = _Curve("pretrained" if pretrained else "scratch")
    init = default_tokenizer_path().parent if pretrained else None
    trainer = Trainer(problem, model, hp, strategy=Strategy(sync_every=args.eval_every), loggers=[],
                      eval_every=args.eval_every, eval_batches=max(1, args.eval_examples // args.batch_size),
                      callbacks=[curve], init_from=init)
    for line in trainer.notices:
        print(f"  {curve.name}: {line}", flush=True)
    start = trainer.evaluate("valid")
    curve.points.insert(0, {"step": 0, "accuracy": start["accuracy"], "loss": start["loss"]})
    print(f"  {curve.name} step    0: valid accuracy {start['accuracy']:.4f} loss {start['loss']:.4f}", flush=True)
    began = time.monotonic()
    trainer.fit()
    test = trainer.evaluate("test", max_batches=args.test_batches)
    return {"init": "all-MiniLM-L6-v2" if pretrained else "random (BERT init)", "learning_rate": lr,
            "curve": curve.points, "final_valid_accuracy": curve.points[-1]["accuracy"],
            "test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_examples": test["examples"],
            "wall_seconds": round(time.monotonic() - began, 1)}


def _run_in_process(args: argparse.Namespace, pretrained: bool) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    return run_one(PTBNextSentence(), args, pretrained)


def first_step_reaching(curve: list[dict[str, float]], accuracy: float) -> int | None:
    """The first evaluated step whose valid accuracy is at least ``accuracy`` (None: never)."""
    return next((p["step"] for p in curve if p["accuracy"] >= accuracy), None)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--eval-every", type=int, default=15)
    parser.add_argument("--eval-examples", type=int, default=256)
    parser.add_argument("--test-batches", type=int, default=64, help="test batches at the end (0: all 2,048 pairs)")
    parser.add_argument("--lr-pretrained", type=float, default=1e-4)
    parser.add_argument("--lr-scratch", type=float, default=5e-4)
    parser.add_argument("--pooling", choices=("cls", "mean"), default="mean",
                        help="the classifier's input (bert classifier_pooling)")
    parser.add_argument("--threads", type=int, default=2, help="threads per run")
    parser.add_argument("--parallel", action="store_true", help="both runs at once, one process each")
    parser.add_argument("--json", default=None, help="write the report here (e.g. docs/data/finetune_minilm.json)")
    parser.add_argument("--smoke", action="store_true", help="4 steps, tiny evaluations: checks the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.eval_every, args.eval_examples, args.test_batches = 4, 4, 2, 8, 2
    torch.set_num_threads(args.threads)
    names = {"pretrained": True, "scratch": False}
    if args.parallel:       # one process per run, each with --threads threads
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {name: pool.submit(_run_in_process, args, pretrained) for name, pretrained in names.items()}
            runs = {name: future.result() for name, future in futures.items()}
    else:
        problem = PTBNextSentence()
        runs = {}
        for name, pretrained in names.items():
            print(f"{name}:", flush=True)
            runs[name] = run_one(problem, args, pretrained)
    target = max(p["accuracy"] for p in runs["scratch"]["curve"][1:])
    reached = {name: first_step_reaching(run["curve"][1:], target) for name, run in runs.items()}
    thresholds = {f"{t:.2f}": {name: first_step_reaching(run["curve"][1:], t) for name, run in runs.items()}
                  for t in (0.55, 0.60, 0.65, 0.70, 0.75, 0.80)}
    report = {
        "benchmark": "benchmarks/finetune.py", "command": " ".join(["PYTHONPATH=. python benchmarks/finetune.py",
                                                                   *(sys.argv[1:] if argv is None else argv)]),
        "task": "ptb_next_sentence (label 1: B is the PTB sentence after A; 0: a random sentence of the split)",
        "model": "bert, bert_minilm_l6 hparams (6 layers, 384 hidden, 12 heads, 1536 feed-forward, vocab 30522)",
        "steps": args.steps, "batch_size": args.batch_size, "classifier_pooling": args.pooling,
        "max_length": args.max_length,
        "eval_every": args.eval_every, "eval_examples": args.eval_examples,
        "machine": {"cpu": detect_hardware(torch.device("cpu")).describe(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "python": platform.python_version()},
        "runs": runs,
        "target_accuracy": target,
        "target_meaning": "the best valid accuracy the scratch run reaches within the steps",
        "first_step_reaching_target": reached,
        "first_step_reaching": thresholds,
    }
    pre, scratch = reached["pretrained"], reached["scratch"]
    report["steps_ratio"] = (pre / scratch) if pre is not None and scratch else None
    print(f"target {target:.4f}: pretrained at step {pre}, scratch at step {scratch}; test accuracy "
          f"pretrained {runs['pretrained']['test_accuracy']:.4f}, scratch {runs['scratch']['test_accuracy']:.4f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
