"""``hotloop eval``: evaluate a trained run's checkpoint on each split."""
from __future__ import annotations

import argparse

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "eval"
HELP = "evaluate a checkpoint on each split"
RUN_FLAGS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default=None, help="run directory (uses its best, else latest checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint file")
    parser.add_argument("--which", choices=("best", "latest"), default="best")
    parser.add_argument("--splits", default="valid,test")
    parser.add_argument("--data-dir", default=None, help="prepared data (default: the run's recorded one)")
    parser.add_argument("--raw-dir", default=None, help="raw files (default: the run's recorded ones)")
    parser.add_argument("--raw-root", default=None, metavar="DIR",
                        help="raw-data root (HOTLOOP_RAW_ROOT; default: the run's recorded root)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--metrics", default="loss", help="loss (teacher-forced) and/or bleu (decodes the split)")
    parser.add_argument("--beam-size", type=int, default=4, help="for --metrics bleu (1 = greedy)")
    parser.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty for --metrics bleu")


def run(args: argparse.Namespace) -> int:
    from ..compose.restore import evaluate_checkpoint
    from ..compose.restore import find_checkpoint
    from .common import CLIError
    metrics = {m.strip() for m in args.metrics.split(",") if m.strip()}
    if not metrics or metrics - {"loss", "bleu"}:
        raise CLIError(f"--metrics {args.metrics!r}: choose loss, bleu or loss,bleu")
    path = find_checkpoint(args.output_dir, args.checkpoint, which=args.which)
    splits = [s for s in args.splits.split(",") if s]
    print(f"checkpoint {path}")
    if "bleu" in metrics:
        _print_bleu(path, splits, args)
    if "loss" not in metrics:
        return 0
    results = evaluate_checkpoint(path, splits, device=args.device, data_dir=args.data_dir, raw_dir=args.raw_dir,
                                  raw_root=args.raw_root)
    for split, metrics in results.items():
        if isinstance(metrics, str):
            print(f"  {split}: {metrics}")
        else:
            shown = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
            print(f"  {split}: {shown}")
    return 0


def _print_bleu(path: object, splits: list[str], args: argparse.Namespace) -> None:
    """Decode each split with the checkpoint's model and print sacreBLEU with its signature."""
    from ..decode import bleu_on_split
    from ..compose.restore import load_trained
    trained = load_trained(path, device=args.device, data_dir=args.data_dir, raw_dir=args.raw_dir,
                           raw_root=args.raw_root)
    for split in splits:
        result = bleu_on_split(trained.model, trained.problem, trained.hp, split, beam_size=args.beam_size,
                               alpha=args.alpha, device=args.device)
        print(f"  {split}: {result}")
