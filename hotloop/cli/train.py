"""``hotloop train``: validate everything, plan the Strategy once, then train.

Order: the settings (``--config`` file, then the flags given on the command line,
then the defaults; :mod:`hotloop.compose.config`), names and overrides, the Strategy
request (parsed and checked once), the device, the loggers and the output
directory; then datagen, the model, the concrete Strategy
(:func:`hotloop.compose.plan.plan_strategy`) and the Trainer. Inside a ``--nproc``
worker the process group is joined first and the run's data-parallel context is
made from the planned Strategy.

The output directory has one owner: before anything is written, the process (global
rank 0 of a ``--nproc`` job) takes the lock of :mod:`hotloop.train.runlock`; a second
``hotloop train`` on it exits 2 at once naming the holder, or waits ``--wait-for-lock``
seconds. ``--resume`` on a run that already reached its limit changes nothing
(:mod:`hotloop.train.finished`).

Exit codes: 0 done (or already finished); 2 bad input (one ``hotloop: error:`` line,
nothing written), also a held output directory, a full disk and a non-finite loss under
``--on-nonfinite stop``; 130 after Ctrl-C, 143 after SIGTERM, 138 after SIGUSR1 (a
checkpoint is written first).
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import Any

from .common import CLIError
from .init_flags import add_init_arguments
from .monitor_flags import add_monitor_flags, check_monitor_flags, early_stopping
from .run_record import print_summary, run_info

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run", "check_output_dir", "check_writable",
           "take_run_lock", "print_summary", "TRAIN_DEFAULTS"]

NAME = "train"
HELP = "train a model on a problem"
RUN_FLAGS = True

#: defaults of the train settings that a config file may set (flags default to None = "not given")
TRAIN_DEFAULTS: dict[str, Any] = {"eval_every": 500, "keep_last": 3, "strategy": "auto",
                                  "loggers": "jsonl,tensorboard", "on_nonfinite": "stop", "eval_bleu": 0,
                                  "init_strict": False, "init_hparams_from_config": False,
                                  "mode": "min", "early_stop": 0, "early_stop_min_delta": 0.0}
#: config key -> argparse dest, where they differ
_DEST = {"overrides": "override", "strategy_overrides": "strategy_override"}
#: the namespace attribute with the arguments typed after ``hotloop train`` (set by :func:`hotloop.cli.main`)
_ARGV = "command_argv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="run.yaml | run.json with the run's settings (flags given here win)")
    parser.add_argument("--output-dir", default=None, help="default: runs/<problem>-<model>-<hparams>")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--max-time", type=float, default=None, help="seconds")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="steps between evaluations (0: epoch ends; default 500)")
    parser.add_argument("--keep-last", type=int, default=None, help="checkpoints kept besides the best (default 3)")
    parser.add_argument("--eval-bleu", type=int, default=None, metavar="N",
                        help="translation problems: at each evaluation, greedy BLEU of the first N x 64 valid "
                             "sentences, added to the valid row (default 0: off)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint; start fresh when there is none yet")
    add_init_arguments(parser)
    parser.add_argument("--wait-for-lock", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to SECONDS for another run holding --output-dir to exit (a requeued "
                             "job: --resume --wait-for-lock 300); default 0: refuse at once")
    parser.add_argument("--strategy", default=None, help="auto (default) | default | a JSON file of Strategy fields")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                        help="shortcut for --strategy-override precision=...")
    parser.add_argument("--accum-steps", type=int, default=None, metavar="N",
                        help="gradient accumulation: shortcut for --override accum_steps=N")
    parser.add_argument("--loggers", default=None,
                        help="comma list of jsonl, csv, tensorboard, wandb, mlflow, none (default jsonl,tensorboard)")
    parser.add_argument("--on-nonfinite", choices=("stop", "skip"), default=None,
                        help="a non-finite loss stops the run (default) or its update is skipped and counted")
    add_monitor_flags(parser)
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel worker processes")
    parser.add_argument("--async-checkpoint", action="store_true", help="--nproc: write checkpoints in the background")
    parser.add_argument("--max-restarts", type=int, default=0, help="restart a failed worker group N times")
    parser.add_argument("--nnodes", default=None, metavar="N|MIN:MAX",
                        help="nodes of a multi-node job (run the same line on each; Slurm steps set it)")
    parser.add_argument("--node-rank", type=int, default=None, help="this node's rank (0 runs the rendezvous)")
    parser.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="node rank 0's address")
    parser.add_argument("--rdzv-id", default=None, help="the job's id, the same on every node")
    parser.add_argument("--dist-timeout", type=float, default=None, metavar="SECONDS",
                        help="collective timeout of the workers (default 1800; HOTLOOP_DIST_TIMEOUT_S)")


def _probe_parser() -> argparse.ArgumentParser:
    from .common import add_import_flag, add_run_flags
    probe = argparse.ArgumentParser(add_help=False)
    add_import_flag(probe)
    add_run_flags(probe)
    add_arguments(probe)
    return probe


def _given_flags(args: argparse.Namespace) -> set[str]:
    """The dests of the flags given on the command line (fallback: those that differ from defaults)."""
    probe = _probe_parser()
    argv = getattr(args, _ARGV, None)
    if argv is None:
        defaults = vars(probe.parse_known_args([])[0])
        return {k for k, v in vars(args).items() if k in defaults and v != defaults[k]}
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_known_args(argv)[0]))


def apply_config(args: argparse.Namespace) -> None:
    """Fill ``args`` from ``--config`` (flags given win; overrides combine), then the defaults.

    Settings end typed: ``args.strategy`` is ``auto``/``default``/a file or a mapping of fields,
    ``args.strategy_changes`` the typed Strategy field changes and ``args.hparams_changes`` the
    hparams changes (each the file's, then the flags'; the user's ``k=v`` text is split once and
    its values converted once, by the hparams class, when applied).
    """
    from ..compose.config import check_counts, hparams_changes, load_config
    from ..engine.strategy import Strategy
    from .common import apply_raw_root, import_modules, resolve_device
    given = _given_flags(args)
    config = load_config(args.config) if args.config else {}
    changes = _strategy_changes(config.get("strategy_overrides"))
    args.hparams_changes = hparams_changes(config.get("overrides"), args.override if "override" in given else None)
    for key, value in config.items():
        dest = _DEST.get(key, key)
        if key in ("strategy_overrides", "overrides"):
            continue
        if dest in given:
            continue
        elif key == "loggers" and isinstance(value, list):
            value = ",".join(value)
        elif key == "device":
            value = resolve_device(value)
        elif key == "imports":
            import_modules(value)
        elif key == "raw_root" and not (value and os.path.isdir(value)):
            continue                    # a recorded root that is gone: the environment's is used
        setattr(args, dest, value)
    apply_raw_root(args)
    for key, value in TRAIN_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    # the user's text, parsed once; the flag's changes win over the file's
    args.strategy_changes = {**changes, **Strategy.parse_overrides(args.strategy_override)}
    _apply_shortcuts(args)
    check_counts(vars(args))


def _strategy_changes(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """A config file's ``strategy_overrides`` (a mapping of typed values, or ``"k=v"`` text) as typed changes."""
    from ..engine.strategy import Strategy
    return Strategy.field_changes(value) if isinstance(value, dict) else Strategy.parse_overrides(value)


def _apply_shortcuts(args: argparse.Namespace) -> None:
    """``--precision`` is a typed Strategy change, ``--accum-steps`` a typed hparams change; a
    different explicit value given on the command line is an error."""
    if args.precision:
        explicit = args.strategy_changes.get("precision")
        if explicit is not None and explicit != args.precision:
            raise CLIError(f"--precision {args.precision} conflicts with --strategy-override precision={explicit}")
        args.strategy_changes["precision"] = args.precision
    if args.accum_steps is not None:
        if args.accum_steps < 1:
            raise CLIError(f"--accum-steps must be >= 1, got {args.accum_steps}")
        explicit = args.hparams_changes.get("accum_steps")
        if explicit is not None and str(explicit).strip() != str(args.accum_steps):
            raise CLIError(f"--accum-steps {args.accum_steps} conflicts with --override accum_steps={explicit}")
        args.hparams_changes["accum_steps"] = args.accum_steps


def strategy_request(args: argparse.Namespace) -> Any:
    """The Strategy request from ``--strategy`` (a name, a file, or a config mapping) and the typed changes."""
    from ..compose.plan import StrategyRequest
    return StrategyRequest.parse(args.strategy, args.strategy_changes, args.device)


def check_writable(out: Path) -> None:
    """A directory (or none yet) whose nearest existing ancestor allows writing."""
    import os
    if out.exists() and not out.is_dir():
        raise CLIError(f"output directory {out} exists and is not a directory")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise CLIError(f"output directory {out} is not writable ({ancestor} does not allow writing)")


def check_output_dir(out: Path, resume: bool) -> None:
    """Writable (nearest existing ancestor), and not clobbering checkpoints without ``--resume``."""
    from ..train.checkpoint import CheckpointManager
    check_writable(out)
    has_checkpoints = bool(CheckpointManager(out / "checkpoints", writer=False).steps())
    if has_checkpoints and not resume:
        raise CLIError(f"{out} already has checkpoints; continue with --resume or pick another --output-dir")


def check_same_run(out: Path, problem: str, model: str) -> None:
    """``--resume`` into a directory of another problem or model is an error (from its ``run.json``)."""
    from ..train.runfiles import read_run_info
    saved = read_run_info(out)
    if not saved:
        return
    for key, current in (("problem", problem), ("model", model)):
        if saved.get(key) and saved[key] != current:
            raise CLIError(f"--resume: {out} holds a run of {key} {saved[key]!r}, not {current!r}; "
                           f"pick another --output-dir")


def reuse_run_data(args: argparse.Namespace, out: Path) -> None:
    """``--resume``: the data directory, raw directory and roots that ``out``'s ``run.json`` records,
    where neither the command line nor ``--config`` names them (:mod:`hotloop.compose.run_data`)."""
    from ..compose.run_data import DATA_ROOT_ENV, recorded_data
    from ..train.runfiles import read_run_info
    from .common import apply_raw_root
    data = recorded_data(read_run_info(out), data_dir=args.data_dir, raw_dir=args.raw_dir, raw_root=args.raw_root)
    args.data_dir, args.raw_dir, args.raw_root = data.data_dir, data.raw_dir, data.raw_root
    apply_raw_root(args)
    if data.data_root:
        os.environ[DATA_ROOT_ENV] = data.data_root


def _global_rank() -> int:
    import os
    from . import cli_support
    return int(os.environ.get("RANK", "0")) if cli_support.in_worker() else 0


def take_run_lock(args: argparse.Namespace, out: Path, *, check_only: bool = False) -> Any:
    """The run directory's lock (:class:`~hotloop.train.runlock.RunLock`), held by global rank 0 only.

    Other ranks get None: they write nothing outside their own shard files. ``check_only``
    writes nothing: it raises (after ``--wait-for-lock``) when another run holds ``out``.
    """
    import shlex
    from ..train.runlock import RunLock
    wait = getattr(args, "wait_for_lock", 0.0) or 0.0
    if wait < 0:
        raise CLIError(f"--wait-for-lock must be >= 0, got {wait:g}")
    if _global_rank() != 0:
        return None
    check_writable(out)
    command = shlex.join(["hotloop", "train", *(getattr(args, _ARGV, None) or [])])
    lock = RunLock(out, command=command, rank=0)
    if check_only:
        lock.probe(wait)
        return None
    return lock.acquire(wait)


def run(args: argparse.Namespace) -> int:
    from . import cli_support
    from ..train.bleu_during_training import supports_bleu
    from ..compose.build import resolve_names
    from .init_flags import init_overrides, read_init
    from ..train.checkpoint import CheckpointManager
    from ..train.tracking import parse_logger_names
    apply_config(args)
    overrides = dict(args.hparams_changes)
    for key in ("max_steps", "max_epochs"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    overrides = init_overrides(args, overrides)
    problem_cls, model_cls, hparams_name, hp = resolve_names(args.problem, args.model, args.hparams, overrides)
    args.init_weights = read_init(args, hp)   # read and checked before anything is written
    request = strategy_request(args)
    parse_logger_names(args.loggers)
    check_monitor_flags(args)
    if args.eval_bleu < 0:
        raise CLIError(f"--eval-bleu must be >= 0, got {args.eval_bleu}")
    if args.eval_bleu and not supports_bleu(problem_cls):
        raise CLIError(f"--eval-bleu needs a text translation problem (raw split text and a subword "
                       f"encoder); {args.problem} is not one")
    out = Path(args.output_dir or f"runs/{args.problem}-{args.model}-{hparams_name}")
    take_run_lock(args, out, check_only=True)   # a held directory is named first, before other checks
    if cli_support.in_worker():  # one rank of a --nproc job: this rank's device, resume on restart
        args.device = cli_support.worker_device(args.device)
        has = bool(CheckpointManager(out / "checkpoints", writer=False).steps())
        args.resume = cli_support.restart_resume(args.resume, has)
    check_output_dir(out, args.resume)
    if args.resume:
        check_same_run(out, args.problem, args.model)
        reuse_run_data(args, out)
    lock = take_run_lock(args, out)   # the first write into the output directory
    try:
        return _run_owned(args, problem_cls, model_cls, hparams_name, hp, request, out)
    finally:
        if lock is not None:
            lock.release()


def _run_owned(args: argparse.Namespace, problem_cls: type, model_cls: type, hparams_name: str, hp: Any,
               request: Any, out: Path) -> int:
    """``run`` once the output directory is this job's: the finished check, the job, then training."""
    from . import cli_support
    from ..train.finished import finished_message
    job = None
    if args.resume:
        main = _global_rank() == 0
        done = finished_message(out, hp.max_steps, hp.max_epochs, writer=main,
                                notify=print if main else (lambda message: None))
        if done:
            if main:
                print(done)
            return 0
    if cli_support.in_worker():
        job = cli_support.join_job()
    else:
        job = cli_support.join_single_process_job(request)
    try:
        return _train(args, problem_cls, model_cls, hparams_name, hp, request, out, job)
    except OSError as exc:
        if job is not None:
            job.close(failed=True)
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise CLIError(f"cannot write {exc.filename or out}: no space left on device") from None
        raise
    except BaseException:
        if job is not None:
            job.close(failed=True)
        raise


def _train(args: argparse.Namespace, problem_cls: type, model_cls: type, hparams_name: str, hp: Any,
           request: Any, out: Path, job: Any) -> int:
    from .cli_support import prepare_in_rank_order
    from .common import stops_at_once
    from ..compose import build
    from ..train.bleu_during_training import BleuAtEval
    from ..compose.plan import plan_strategy
    from ..train.tracking import build_loggers
    from ..train.trainer import Trainer
    info = run_info(args, hparams_name, out)
    is_main = job is None or getattr(job, "is_main", True)
    loggers = build_loggers(args.loggers, out, run_name=out.name, config=info) if is_main else []
    problem = problem_cls(data_dir=args.data_dir, raw_dir=args.raw_dir)
    with stops_at_once():            # datagen has nothing to save: a stop signal ends it at once
        prepare_in_rank_order(problem.prepare, job)
    model = build.build_model(model_cls, hp, problem.spec(hp), args.device)
    strategy = plan_strategy(request, model=model, problem=problem, hp=hp, device=args.device,
                             max_time=args.max_time, log=print, dist=job)
    dist = job.for_strategy(strategy) if job is not None else None
    callbacks = build.run_callbacks(problem, args.monitor, args.mode)
    callbacks.extend(getattr(args, "extra_callbacks", ()))   # a caller's own (hotloop search's trial reporter)
    if args.eval_bleu:
        callbacks.append(BleuAtEval(args.eval_bleu))
    callbacks += early_stopping(args)
    trainer = Trainer(problem, model, hp, strategy=strategy, device=args.device, output_dir=out,
                      max_time=args.max_time, eval_every=args.eval_every, keep_last=args.keep_last,
                      run_info=info, dist=dist, callbacks=callbacks, loggers=loggers,
                      on_nonfinite=args.on_nonfinite, init_from=getattr(args, "init_weights", None),
                      init_strict=args.init_strict, monitor=args.monitor, mode=args.mode,
                      async_checkpoint=args.async_checkpoint)
    code = 0
    try:
        result = trainer.fit(resume=args.resume)
    except KeyboardInterrupt as exc:
        code = int(getattr(exc, "exit_code", 130))
        saved = f"checkpoint {trainer.last_checkpoint}" if trainer.last_checkpoint else "no checkpoint"
        cause = f" ({exc})" if str(exc) and str(exc) != "SIGINT" else ""
        if trainer.dist.is_main:
            print(f"hotloop: interrupted at step {trainer.step}{cause}; {saved} (continue with --resume)",
                  file=sys.stderr)
    else:
        if trainer.dist.is_main:
            print_summary(result)
    if dist is not None:
        dist.close(failed=code != 0)
    return code
