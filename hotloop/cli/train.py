"""``hotloop train``: validate everything, plan the Strategy once, then train.

Order: names and overrides, the Strategy request (parsed and checked once), the
device and output directory; then datagen, the model, the concrete Strategy
(:func:`hotloop.train.plan.plan_strategy`) and the Trainer. Inside a ``--nproc``
worker the process group is joined first and the run's data-parallel context is
made from the planned Strategy.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .common import CLIError

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run", "check_output_dir"]

NAME = "train"
HELP = "train a model on a problem"
RUN_FLAGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default=None, help="default: runs/<problem>-<model>-<hparams>")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--max-time", type=float, default=None, help="seconds")
    parser.add_argument("--eval-every", type=int, default=500, help="steps between evaluations (0: epoch ends)")
    parser.add_argument("--keep-last", type=int, default=3, help="checkpoints kept besides the best")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--strategy", default="auto", help="auto | default | a JSON file of Strategy fields")
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel worker processes")
    parser.add_argument("--max-restarts", type=int, default=0, help="restart a failed worker group N times")


def check_output_dir(out: Path, resume: bool) -> None:
    """Writable (nearest existing ancestor), and not clobbering or missing checkpoints."""
    from ..train.checkpoint import CheckpointManager
    if out.exists() and not out.is_dir():
        raise CLIError(f"output directory {out} exists and is not a directory")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise CLIError(f"output directory {out} is not writable ({ancestor} does not allow writing)")
    has_checkpoints = bool(CheckpointManager(out / "checkpoints", writer=False).steps())
    if resume and not has_checkpoints:
        raise CLIError(f"--resume: no checkpoint in {out / 'checkpoints'}")
    if has_checkpoints and not resume:
        raise CLIError(f"{out} already has checkpoints; continue with --resume or pick another --output-dir")


def run(args: argparse.Namespace) -> int:
    from ..parallel import cli_support
    from ..train.build import resolve_names
    from ..train.checkpoint import CheckpointManager
    from ..train.plan import StrategyRequest
    overrides = args.override or ""
    for key in ("max_steps", "max_epochs"):
        if getattr(args, key) is not None:
            overrides += f",{key}={getattr(args, key)}"
    problem_cls, model_cls, hparams_name, hp = resolve_names(args.problem, args.model, args.hparams, overrides)
    request = StrategyRequest.parse(args.strategy, args.strategy_override, args.device)
    out = Path(args.output_dir or f"runs/{args.problem}-{args.model}-{hparams_name}")
    job = None
    if cli_support.in_worker():  # one rank of a --nproc job: this rank's device, resume on restart
        args.device = cli_support.worker_device(args.device)
        has = bool(CheckpointManager(out / "checkpoints", writer=False).steps())
        args.resume = cli_support.restart_resume(args.resume, has)
    check_output_dir(out, args.resume)
    if cli_support.in_worker():
        job = cli_support.join_job()
    try:
        return _train(args, problem_cls, model_cls, hparams_name, hp, request, out, job)
    except BaseException:
        if job is not None:
            job.close(failed=True)
        raise


def _train(args: argparse.Namespace, problem_cls: type, model_cls: type, hparams_name: str, hp: Any,
           request: Any, out: Path, job: Any) -> int:
    from ..parallel.cli_support import prepare_in_rank_order
    from ..train.build import build_model
    from ..train.plan import plan_strategy
    from ..train.trainer import Trainer
    problem = problem_cls(data_dir=args.data_dir, raw_dir=args.raw_dir)
    prepare_in_rank_order(problem.prepare, job)
    model = build_model(model_cls, hp, problem.spec(hp), args.device)
    strategy = plan_strategy(request, model=model, problem=problem, hp=hp, device=args.device,
                             max_time=args.max_time, log=print, dist=job)
    dist = job.for_strategy(strategy) if job is not None else None
    info = {"problem": args.problem, "model": args.model, "hparams_set": hparams_name,
            "overrides": args.override or "", "data_dir": args.data_dir, "raw_dir": args.raw_dir,
            "imports": list(args.imports)}
    trainer = Trainer(problem, model, hp, strategy=strategy, device=args.device, output_dir=out,
                      max_time=args.max_time, eval_every=args.eval_every, keep_last=args.keep_last,
                      run_info=info, dist=dist)
    code = 0
    try:
        result = trainer.fit(resume=args.resume)
    except KeyboardInterrupt:
        saved = f"checkpoint {trainer.last_checkpoint}" if trainer.last_checkpoint else "no checkpoint"
        print(f"hotloop: interrupted at step {trainer.step}; {saved} (continue with --resume)", file=sys.stderr)
        code = 130
    else:
        if trainer.dist.is_main:
            print_summary(result)
    if dist is not None:
        dist.close(failed=code != 0)
    return code


def print_summary(result: Any) -> None:
    """The end-of-run lines: steps, time, stop reason, last metrics, checkpoints."""
    print(f"done: {result.steps} steps, {result.epochs} epochs in {result.wall_time:.1f} s ({result.stop_reason})")
    for split, metrics in result.metrics.items():
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k not in ("tokens", "examples"))
        print(f"  {split}: {shown}")
    if result.last_checkpoint:
        best = f", best {Path(result.best_checkpoint).name}" if result.best_checkpoint else ""
        print(f"  checkpoints: {Path(result.last_checkpoint).parent} (last {Path(result.last_checkpoint).name}{best})")
