"""``hotloop search``: hyperparameter search with Optuna; every trial is a normal ``hotloop train`` run.

The command checks everything first (names, overrides, the space file against the hparams
class, the Strategy request, the study), prepares the data, plans the Strategy once
(:mod:`hotloop.search.planning`), then runs trials until ``--trials`` are complete or pruned:
in this process with ``--jobs 1``, else in K worker processes (:mod:`hotloop.search.jobs`).
A trial is ``hotloop train`` run in the trial's process with the search's flags, the sampled
hparams appended to ``--override``, ``--strategy DIR/strategy.json`` and ``--output-dir
DIR/trial_NNNN``, plus the callback that reports each evaluation (:mod:`hotloop.search.reporter`).
At the end: the table of trials, ``DIR/summary.json`` and ``DIR/best.json``. See ``docs/search.md``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import train
from .common import CLIError

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run", "trial_argv", "train_option_strings"]

NAME = "search"
HELP = "hyperparameter search (Optuna) over a space file; each trial is a normal train run"
RUN_FLAGS = True

#: train flags a search decides itself instead of passing them on to its trials
_NOT_FORWARDED = {"config", "output_dir", "resume", "wait_for_lock", "nproc", "max_restarts"}
#: train flags folded into the search's one planned Strategy (``DIR/strategy.json``)
_IN_STRATEGY = {"strategy", "precision"}
_OWN = ("--space", "--trials", "--output-dir", "--storage", "--study-name", "--jobs", "--metric", "--mode",
        "--pruner", "--prune-startup", "--prune-warmup")
_MARKER = "search.json"


def _train_probe() -> list[argparse.Action]:
    probe = argparse.ArgumentParser(add_help=False)
    train.add_arguments(probe)
    return probe._actions


def _train_actions() -> list[argparse.Action]:
    """The ``hotloop train`` flags a search takes and passes on (those not named like its own)."""
    return [a for a in _train_probe() if a.dest not in _NOT_FORWARDED and not set(a.option_strings) & set(_OWN)]


def train_option_strings() -> set[str]:
    """Every option string of ``hotloop train`` (those a search shadows with its own included)."""
    return {o for a in _train_probe() for o in a.option_strings}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..search.jobs import WORKER_FLAG
    parser.add_argument("--space", default=None, metavar="FILE", help="search space (YAML or JSON), see docs/search.md")
    parser.add_argument("--trials", type=int, default=None, metavar="N",
                        help="run until N trials are complete or pruned (a rerun continues the study)")
    parser.add_argument("--output-dir", default=None, metavar="DIR",
                        help="default searches/<problem>-<model>-<hparams>; trial 7 trains in DIR/trial_0007")
    parser.add_argument("--storage", default=None, metavar="URL", help="the study's database (default sqlite:///DIR/study.db)")
    parser.add_argument("--study-name", default=None, help="default: the output directory's name")
    parser.add_argument("--jobs", type=int, default=1, metavar="K", help="worker processes running trials at once")
    parser.add_argument("--metric", default="loss", help="the valid metric to optimise (default loss)")
    parser.add_argument("--mode", choices=("min", "max"), default=None,
                        help="minimise or maximise --metric (default min for loss and ppl; required otherwise)")
    parser.add_argument("--pruner", choices=("median", "none"), default="median",
                        help="median: stop a trial whose metric is worse than the median of earlier trials at "
                             "the same step (at each evaluation); none: never prune")
    parser.add_argument("--prune-startup", type=int, default=3, metavar="N",
                        help="trials that finish before any is pruned (default 3)")
    parser.add_argument("--prune-warmup", type=int, default=0, metavar="STEPS",
                        help="steps of a trial before it can be pruned (default 0)")
    parser.add_argument(WORKER_FLAG, dest="search_worker", type=int, default=None, help=argparse.SUPPRESS)
    for action in _train_actions():
        parser._add_action(action)


def trial_argv(args: argparse.Namespace, params: dict[str, Any], out: Path, strategy_file: Path) -> list[str]:
    """The ``hotloop train`` command line of one trial: the search's flags, ``params`` appended to
    ``--override``, the search's Strategy file and the trial's output directory."""
    from ..search.space import render_value
    argv = ["train", "--problem", args.problem, "--model", args.model, "--device", args.device]
    for flag, value in (("--hparams", args.hparams), ("--data-dir", args.data_dir), ("--raw-dir", args.raw_dir)):
        if value:
            argv += [flag, str(value)]
    for spec in args.imports:
        argv += ["--import", spec]
    parts = [p for p in (args.override or "").split(",") if p.strip()]
    override = ",".join(parts + [f"{k}={render_value(v)}" for k, v in params.items()])
    if override:
        argv += ["--override", override]
    for action in _train_actions():
        value = getattr(args, action.dest, None)
        if action.dest in _IN_STRATEGY or value is None or value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(action.option_strings[0 if value else 1])
        elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            argv.append(flag)
        else:
            for item in value if isinstance(value, list) else [value]:
                argv += [flag, str(item)]
    if "--monitor" in train_option_strings() and getattr(args, "monitor", None) is None:
        argv += ["--monitor", args.metric]      # each trial's best checkpoint follows the searched metric
    if "--mode" in train_option_strings():
        argv += ["--mode", args.mode or "min"]
    return argv + ["--strategy", str(strategy_file), "--output-dir", str(out)]


@dataclass
class _Search:
    """A checked search: what to run and where."""

    problem_cls: type
    model_cls: type
    hparams_name: str
    hp: Any
    space: Any
    request: Any
    directory: Path
    storage: str
    study_name: str
    metric: str
    mode: str
    study: Any = None


def _check(args: argparse.Namespace) -> _Search:
    from ..compose.build import resolve_names
    from ..search.space import load_space
    from ..search.study import check_storage_url, default_storage
    from ..train.tracking import parse_logger_names
    for flag in ("--space", "--trials"):
        if getattr(args, flag[2:]) is None:
            raise CLIError(f"hotloop search needs {flag} (see docs/search.md)")
    for flag, value, low in (("--trials", args.trials, 1), ("--jobs", args.jobs, 1),
                             ("--prune-startup", args.prune_startup, 0), ("--prune-warmup", args.prune_warmup, 0)):
        if value < low:
            raise CLIError(f"{flag} must be >= {low}, got {value}")
    mode = args.mode or ("min" if args.metric in ("loss", "ppl") else None)
    if mode is None:
        raise CLIError(f"--metric {args.metric}: say --mode max or --mode min")
    settings = argparse.Namespace(**vars(args))
    settings.config = None
    train.apply_config(settings)       # the typed hparams and Strategy changes, as hotloop train makes them
    fixed = dict(settings.hparams_changes)
    for key in ("max_steps", "max_epochs"):
        if getattr(args, key, None) is not None:
            fixed[key] = getattr(args, key)
    problem_cls, model_cls, hparams_name, hp = resolve_names(args.problem, args.model, args.hparams, fixed)
    space = load_space(args.space, hp)
    both = [name for name in space.names if name in fixed]
    if both:
        raise CLIError(f"hparam {both[0]!r} is both searched ({args.space}) and fixed on the command line; drop one")
    request = train.strategy_request(settings)
    parse_logger_names(settings.loggers)
    directory = Path(args.output_dir or f"searches/{args.problem}-{args.model}-{hparams_name}")
    train.check_writable(directory)
    storage = check_storage_url(args.storage) if args.storage else default_storage(directory)
    return _Search(problem_cls, model_cls, hparams_name, hp, space, request, directory, storage,
                   args.study_name or directory.resolve().name, args.metric, mode)


def _pair_with_directory(search: _Search) -> None:
    """``DIR/search.json`` names the one study whose trials ``DIR`` holds."""
    from ..search.study import SearchError, write_json
    path = search.directory / _MARKER
    mine = {"storage": search.storage, "study_name": search.study_name}
    if path.is_file():
        saved = json.loads(path.read_text())
        if {k: saved.get(k) for k in mine} != mine:
            raise SearchError(f"{search.directory} holds the trials of study {saved.get('study_name')!r} in "
                              f"{saved.get('storage')}; pick another --output-dir")
        return
    search.directory.mkdir(parents=True, exist_ok=True)
    write_json(path, {**mine, "metric": search.metric, "mode": search.mode, "space": search.space.to_dict()})


def _trial_runner(args: argparse.Namespace, strategy_file: Path) -> Any:
    def run_trial(request: Any) -> int:
        from . import build_parser
        argv = trial_argv(args, request.params, request.output_dir, strategy_file)
        try:
            targs = build_parser(only="train").parse_args(argv)
        except SystemExit:
            raise CLIError(f"the trial's command line does not parse: {' '.join(argv)}") from None
        targs.command_argv = argv[1:]
        targs.extra_callbacks = [request.reporter]
        return int(train.run(targs) or 0)
    return run_trial


def _finish(search: _Search, strategy_file: Path) -> None:
    from ..search.summary import best_trial, format_table, trial_rows, write_best, write_summary
    rows = trial_rows(search.study, search.directory)
    best = best_trial(search.study)
    number = best.number if best is not None else None
    print(format_table(rows, search.metric, number))
    summary = write_summary(search.directory, rows, metric=search.metric, mode=search.mode, best=number,
                            storage=search.storage, study_name=search.study_name, strategy_file=str(strategy_file))
    print(f"summary: {summary}")
    path = write_best(search.directory, best) if best is not None else None
    if path is not None:
        print(f"best: trial {number}, {search.metric}={best.value:.6g}; repeat it with "
              f"hotloop train --config {path} --output-dir DIR")


def run(args: argparse.Namespace) -> int:
    try:
        import optuna
    except ImportError:
        raise CLIError("hotloop search needs Optuna: pip install -e '.[search]'") from None
    from ..search.jobs import run_workers
    from ..search.planning import STRATEGY_FILE, search_strategy
    from ..search.study import SearchError, StudyRecord, open_study
    from ..search.worker import SearchInterrupted, run_trials
    search = _check(args)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=args.prune_startup, n_warmup_steps=args.prune_warmup)
              if args.pruner == "median" else optuna.pruners.NopPruner())
    record = StudyRecord(args.problem, args.model, search.hparams_name, search.metric, search.mode)
    worker = args.search_worker is not None
    if not worker:
        _pair_with_directory(search)      # before the study is opened (or made) in the database
    search.study = open_study(search.storage, search.study_name, record, pruner=pruner)
    strategy_file = search.directory / STRATEGY_FILE
    if worker:
        if not strategy_file.is_file():
            raise SearchError(f"{strategy_file} is missing: a worker runs under hotloop search, after planning")
    else:
        problem = search.problem_cls(data_dir=args.data_dir, raw_dir=args.raw_dir)
        problem.prepare()
        strategy_file = search_strategy(search.directory, search.request, problem=problem,
                                        model_cls=search.model_cls, hp=search.hp, device=args.device,
                                        max_time=args.max_time)
    code = 0
    try:
        if worker or args.jobs == 1:
            code = run_trials(search.study, search.space, search.directory, args.trials, search.metric,
                              _trial_runner(args, strategy_file), prune=args.pruner != "none")
        else:
            argv = list(getattr(args, "command_argv", None) or [])
            code = run_workers(argv, args.jobs, search.directory, search.study)
    except SearchInterrupted as exc:
        code = exc.exit_code
    finally:
        if not worker:
            _finish(search, strategy_file)
    return code
