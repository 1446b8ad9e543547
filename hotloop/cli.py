"""The ``hotloop`` command: list, train, eval, datagen, plus lazily imported tool commands.

Bad input (unknown names, bad overrides, a model that does not serve the
problem, a bad strategy, an unusable checkpoint or output directory) prints
ONE line ``hotloop: error: ...`` on stderr and exits 2, before anything is
written.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["main", "EXTERNAL_COMMANDS", "CLIError"]

# Commands provided by other packages: name -> "module:function", where the
# function is ``main(argv: list[str]) -> int``. Imported only when run.
EXTERNAL_COMMANDS: dict[str, str] = {
    "explain": "hotloop.engine.explain:main",
    "tune": "hotloop.tools.tune_cli:main",
    "profile": "hotloop.tools.profile_cli:main",
}

DEFAULT_PROBLEM = "algorithmic_reverse"
DEFAULT_MODEL = "transformer"


class CLIError(Exception):
    """A user error the CLI reports as one line."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from .engine.strategy import StrategyError
    from .hparams import HParamsError
    from .models.base import ModelMismatchError
    from .registry import RegistryError
    from .train.checkpoint import CheckpointError
    from .train.trainer import TrainerError
    errors: tuple[type[BaseException], ...] = (
        CLIError, RegistryError, HParamsError, StrategyError, ModelMismatchError, CheckpointError,
        TrainerError, FileNotFoundError, PermissionError)
    for module, name in (("hotloop.data.errors", "DataError"), ("hotloop.parallel.errors", "ParallelError")):
        try:
            errors += (getattr(importlib.import_module(module), name),)
        except (ImportError, AttributeError):
            pass
    return errors


# ----------------------------------------------------------------- helpers
def _import_modules(specs: Sequence[str]) -> None:
    from .registry import import_user_module
    for spec in specs:
        try:
            import_user_module(spec)
        except Exception as exc:  # noqa: BLE001 - any failure in user code is reported in one line
            raise CLIError(f"--import {spec}: {type(exc).__name__}: {exc}") from None


def _load_strategy(value: str, overrides: str | None, device: str) -> Any:
    """'auto' (returned as the string), 'default', or a JSON file of Strategy fields; then overrides.
    Overrides are checked (names, types, hardware) before any auto-tuning."""
    from .engine import Strategy, StrategyError, parse_strategy
    from .hparams import HParamsError, apply_overrides
    if value not in ("auto", "default"):
        path = Path(value)
        if not path.is_file():
            raise StrategyError(f"--strategy {value!r}: use auto, default or a JSON file of Strategy fields")
        try:
            fields = json.loads(path.read_text())
            if not isinstance(fields, dict):
                raise ValueError("expected a JSON object")
            # as strings, so the same type conversion and checks as --strategy-override apply
            as_text = {k: ":".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in fields.items()}
            base = apply_overrides(Strategy(), as_text)
        except (ValueError, HParamsError) as exc:
            raise StrategyError(f"--strategy {path}: {str(exc).replace('hparam', 'strategy field')}") from None
    else:
        base = Strategy()
    checked = parse_strategy(base, overrides).validate(device)
    return value if value == "auto" else checked


def _check_device(device: str) -> None:
    import torch
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise CLIError(f"--device {device!r}: use cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is available")


def _check_output_dir(out: Path, resume: bool) -> None:
    """Writable (nearest existing ancestor), and not clobbering or missing checkpoints."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"output directory {out} exists and is not a directory")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise CLIError(f"output directory {out} is not writable ({ancestor} does not allow writing)")
    from .train.checkpoint import CheckpointManager
    has_checkpoints = bool(CheckpointManager(out / "checkpoints").steps())
    if resume and not has_checkpoints:
        raise CLIError(f"--resume: no checkpoint in {out / 'checkpoints'}")
    if has_checkpoints and not resume:
        raise CLIError(f"{out} already has checkpoints; continue with --resume or pick another --output-dir")


# ----------------------------------------------------------------- commands
def cmd_list(args: argparse.Namespace) -> int:
    from .registry import ALL_REGISTRIES
    for title, registry in ALL_REGISTRIES.items():
        print(f"{title}:")
        for name in registry.names():
            print(f"  {name}")
    externals = ", ".join(sorted(EXTERNAL_COMMANDS))
    print(f"commands: list, train, eval, datagen, {externals}")
    return 0


def cmd_datagen(args: argparse.Namespace) -> int:
    from .registry import problems
    problem = problems.get(args.problem)(data_dir=args.data_dir, raw_dir=args.raw_dir)
    problem.prepare()
    print(f"prepared {args.problem} in {args.data_dir or '(generated on the fly; nothing to write)'}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Validate everything (names, overrides, strategy, device, output dir), then train."""
    from .train.build import resolve_names
    _check_device(args.device)
    overrides = args.override or ""
    for key in ("max_steps", "max_epochs"):
        if getattr(args, key) is not None:
            overrides += f",{key}={getattr(args, key)}"
    problem_cls, model_cls, hparams_name, hp = resolve_names(args.problem, args.model, args.hparams, overrides)
    strategy = _load_strategy(args.strategy, args.strategy_override, args.device)
    out = Path(args.output_dir or f"runs/{args.problem}-{args.model}-{hparams_name}")
    parallel = _parallel_support()
    if parallel is not None:  # inside a multi-process job: this rank's device, resume on restart
        args.device = parallel.worker_device(args.device)
        from .train.checkpoint import CheckpointManager
        args.resume = parallel.restart_resume(args.resume, bool(CheckpointManager(out / "checkpoints").steps()))
    _check_output_dir(out, args.resume)
    dist = parallel.worker_context(strategy, args.strategy_override) if parallel is not None else None
    try:
        code = _train(args, problem_cls, model_cls, hparams_name, hp, strategy, out, dist, parallel)
    except BaseException:
        if dist is not None:
            dist.close(failed=True)
        raise
    if dist is not None:
        dist.close()
    return code


def _train(args: argparse.Namespace, problem_cls: type, model_cls: type, hparams_name: str, hp: Any,
           strategy: Any, out: Path, dist: Any, parallel: Any) -> int:
    import torch

    from .train.build import build_model
    from .train.trainer import Trainer, resolve_strategy
    problem = problem_cls(data_dir=args.data_dir, raw_dir=args.raw_dir)
    if parallel is not None:
        parallel.prepare_in_rank_order(problem.prepare, dist)
    else:
        problem.prepare()
    model = build_model(model_cls, hp, problem.spec(hp), args.device)
    if strategy == "auto" and args.strategy_override:
        from .engine import parse_strategy
        strategy = parse_strategy(resolve_strategy("auto", log=print, model=model, problem=problem, hp=hp,
                                                   device=torch.device(args.device),
                                                   planned_steps=hp.max_steps),
                                  args.strategy_override).validate(args.device)
    info = {"problem": args.problem, "model": args.model, "hparams_set": hparams_name,
            "overrides": args.override or "", "data_dir": args.data_dir, "raw_dir": args.raw_dir,
            "imports": list(args.imports)}
    trainer = Trainer(problem, model, hp, strategy=strategy, device=args.device, output_dir=out,
                      max_time=args.max_time, eval_every=args.eval_every, keep_last=args.keep_last,
                      run_info=info, dist=dist)
    try:
        result = trainer.fit(resume=args.resume)
    except KeyboardInterrupt:
        saved = f"checkpoint {trainer.last_checkpoint}" if trainer.last_checkpoint else "no checkpoint"
        print(f"hotloop: interrupted at step {trainer.step}; {saved} (continue with --resume)",
              file=sys.stderr)
        return 130
    if trainer.dist.is_main:
        _print_summary(result)
    return 0


def _parallel_support() -> Any:
    """``hotloop.parallel.cli_support`` when running as a torchrun worker, else None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "WORLD_SIZE" not in os.environ:
        return None
    try:
        from .parallel import cli_support
    except ModuleNotFoundError:
        return None
    return cli_support


def _print_summary(result: Any) -> None:
    print(f"done: {result.steps} steps, {result.epochs} epochs in {result.wall_time:.1f} s "
          f"({result.stop_reason})")
    for split, metrics in result.metrics.items():
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k not in ("tokens", "examples"))
        print(f"  {split}: {shown}")
    if result.last_checkpoint:
        print(f"  checkpoints: {Path(result.last_checkpoint).parent} "
              f"(last {Path(result.last_checkpoint).name}"
              + (f", best {Path(result.best_checkpoint).name})" if result.best_checkpoint else ")"))


def cmd_eval(args: argparse.Namespace) -> int:
    from .train.checkpoint import CheckpointError, CheckpointManager
    from .train.evaluation import evaluate_checkpoint
    _check_device(args.device)
    if bool(args.output_dir) == bool(args.checkpoint):
        raise CLIError("eval needs exactly one of --output-dir or --checkpoint")
    path = Path(args.checkpoint) if args.checkpoint else None
    if path is None:
        manager = CheckpointManager(Path(args.output_dir) / "checkpoints")
        path = (manager.best() if args.which == "best" else None) or manager.latest()
        if path is None:
            raise CheckpointError(f"no checkpoint in {Path(args.output_dir) / 'checkpoints'}")
    splits = [s for s in args.splits.split(",") if s]
    results = evaluate_checkpoint(path, splits, device=args.device, data_dir=args.data_dir,
                                  raw_dir=args.raw_dir)
    print(f"checkpoint {path}")
    for split, metrics in results.items():
        if isinstance(metrics, str):
            print(f"  {split}: {metrics}")
        else:
            shown = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in metrics.items())
            print(f"  {split}: {shown}")
    return 0


def _run_external(name: str, argv: list[str]) -> int:
    module_name, _, func = EXTERNAL_COMMANDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"hotloop: error: command {name!r} is not available: module {module_name} is not "
                  f"installed in this build", file=sys.stderr)
            return 2
        raise
    entry: Callable[[list[str]], int] = getattr(module, func)
    return int(entry(argv) or 0)


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotloop", description="Fast, modular training on PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--import", dest="imports", action="append", default=[], metavar="MOD",
                       help="import a module (name or .py path) that registers components; repeatable")
        p.set_defaults(func=func)
        return p

    add("list", "list every registered problem, model, hparams set, optimizer and schedule", cmd_list)

    p = add("train", "train a model on a problem", cmd_train)
    p.add_argument("--problem", default=DEFAULT_PROBLEM)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--hparams", default=None, help="hparams set (default: the problem's default)")
    p.add_argument("--override", default="", help='hparams overrides "k=v,k=v"')
    p.add_argument("--output-dir", default=None, help="default: runs/<problem>-<model>-<hparams>")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--max-time", type=float, default=None, help="seconds")
    p.add_argument("--eval-every", type=int, default=500, help="steps between evaluations (0: epoch ends)")
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept besides the best")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--raw-dir", default=None)
    p.add_argument("--strategy", default="auto", help="auto | default | a JSON file of Strategy fields")
    p.add_argument("--strategy-override", default=None, help='Strategy overrides "k=v,k=v"')
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel worker processes (hotloop.parallel)")
    p.add_argument("--max-restarts", type=int, default=0, help="restart a failed worker group N times")

    p = add("eval", "evaluate a checkpoint on each split", cmd_eval)
    p.add_argument("--output-dir", default=None, help="run directory (uses its best, else latest checkpoint)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint file")
    p.add_argument("--which", choices=("best", "latest"), default="best")
    p.add_argument("--splits", default="valid,test")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--raw-dir", default=None)
    p.add_argument("--device", default="cpu")

    p = add("datagen", "prepare a problem's data (problem.prepare())", cmd_datagen)
    p.add_argument("--problem", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--raw-dir", default=None)

    for name, target in EXTERNAL_COMMANDS.items():
        sub.add_parser(name, help=f"(from {target.partition(':')[0]})", add_help=False)
    return parser


def _nproc(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--nproc" and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--nproc=") else None)
        if value is not None:
            return int(value) if value.isdigit() else 2  # let the launcher report a bad value
    return 1


def _launch(argv: list[str]) -> int | None:
    """Run ``hotloop train`` in ``--nproc`` workers; None inside a worker (train in this process)."""
    try:
        from .parallel.cli_support import maybe_launch
    except ModuleNotFoundError:
        print("hotloop: error: --nproc needs hotloop.parallel, which is not installed in this build",
              file=sys.stderr)
        return 2
    return maybe_launch(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hotloop`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in EXTERNAL_COMMANDS:
        return _run_external(args_list[0], args_list[1:])
    if args_list and args_list[0] == "train" and _nproc(args_list) > 1:
        code = _launch(args_list)
        if code is not None:
            return code
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    errors = _user_errors()
    try:
        _import_modules(args.imports)
        return args.func(args)
    except errors as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"hotloop: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
