"""Build a run's components from registry names (shared by the CLI and the tools).

``build_run("algorithmic_reverse", "transformer")`` resolves names (clear
errors for typos), applies overrides, checks the model serves the problem's
task, prepares missing data and builds the seeded model.

A problem name may list several problems, ``"a,b,c"``: the run trains one model on
a :class:`~hotloop.problems.multi_problem.MultiProblem` of them (see
``docs/multitask.md``); a model with ``multi_problem = True`` (``multimodel``) gets a
MultiProblem even for one name. :func:`run_callbacks` gives the callbacks such a run
needs (the best checkpoint per problem).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..hparams import HParams, HParamsError, get_hparams
from ..models.base import ModelMismatchError
from ..problems.base import Problem, ProblemSpec
from ..registry import hparams_sets, models, problems
from ..train.events import Callback

__all__ = ["Run", "resolve_names", "build_run", "build_model", "build_recorded_model", "RecordedHParamsError",
           "problem_class", "run_callbacks"]


@dataclass
class Run:
    problem: Problem
    hp: HParams
    spec: ProblemSpec
    model: nn.Module
    info: dict[str, Any] = field(default_factory=dict)  # names, overrides, data dirs (JSON)


def problem_class(problem: str, model_cls: type | None = None) -> type:
    """The class ``--problem`` names: a registered problem, or for ``"a,b,c"`` (or any name when
    ``model_cls.multi_problem`` is set) a MultiProblem class built like one
    (``cls(data_dir=, raw_dir=)``)."""
    if "," in problem or getattr(model_cls, "multi_problem", False):
        from ..problems.multi_problem import multi_problem_class
        return multi_problem_class(problem)
    return problems.get(problem)


def run_callbacks(problem: Problem, monitor: str | None = None, mode: str = "min") -> list[Callback]:
    """The callbacks a run of ``problem`` needs besides the Trainer's own: for a MultiProblem,
    :class:`~hotloop.train.best_per_split.BestPerSplit` (the best checkpoint per problem by
    ``monitor`` in ``mode``)."""
    from ..problems.multi_problem import MultiProblem
    if isinstance(problem, MultiProblem):
        from ..train.best_per_split import BestPerSplit
        return [BestPerSplit(problem.eval_splits, monitor, mode)]
    return []


def resolve_names(problem: str, model: str, hparams: str | None = None,
                  overrides: str | dict[str, Any] | None = None) -> tuple[type, type, str, HParams]:
    """Look up the problem and model classes and the hparams set (default: the problem's set for
    this model, ``Problem.hparams_for``); apply overrides; check the model serves the problem's task.
    ``problem`` may list several problems (``"a,b,c"``, see :func:`problem_class`).
    Imports code but builds nothing."""
    if "," not in problem:
        problems.get(problem)  # an unknown problem name is reported before the model's
    model_cls = models.get(model)
    problem_cls = problem_class(problem, model_cls)
    if not hparams:
        pair = getattr(problem_cls, "hparams_for", None)     # the set sized for this problem and model
        hparams = pair(model) if callable(pair) else getattr(problem_cls, "default_hparams", "")
        if not hparams:
            raise HParamsError(f"problem {problem!r} has no default hparams set for model {model!r}; pass --hparams "
                               f"(one of: {', '.join(hparams_sets.names())})")
    hp = get_hparams(hparams, overrides)
    task = getattr(problem_cls, "task", None)
    tasks = getattr(model_cls, "tasks", None)
    if task is not None and tasks is not None and task not in tasks:
        raise ModelMismatchError(f"model {model!r} serves tasks {list(tasks)}, but problem "
                                 f"{problem!r} is a {task!r} task")
    return problem_cls, model_cls, hparams, hp


def build_model(model_cls: type, hp: HParams, spec: ProblemSpec, device: str | torch.device = "cpu"
                ) -> nn.Module:
    """The model, initialised from ``hp.seed`` (the same weights every time)."""
    torch.manual_seed(hp.seed)
    return model_cls(hp, spec).to(device)


class RecordedHParamsError(HParamsError):
    """Hparams read from a file (a checkpoint, an export manifest) that the model cannot be built with."""


def build_recorded_model(model_cls: type, hp: HParams, spec: ProblemSpec, device: str | torch.device,
                         source: str) -> nn.Module:
    """:func:`build_model` for hparams that a file recorded: whatever the model's constructor
    raises for them (a width of 0, heads that do not divide it) is one line naming ``source``."""
    try:
        return build_model(model_cls, hp, spec, device)
    except Exception as exc:  # noqa: BLE001 - an edited file's hparams can fail any check of any model
        detail = " ".join(str(exc).split())[:200]
        raise RecordedHParamsError(f"{source}: its hparams do not build model {model_cls.__name__} "
                                   f"({type(exc).__name__}: {detail})") from None


def build_run(problem: str, model: str, hparams: str | None = None, overrides: str | None = None, *,
              data_dir: str | Path | None = None, raw_dir: str | Path | None = None,
              device: str | torch.device = "cpu", prepare: bool = True) -> Run:
    """Resolve, prepare data (``problem.prepare()``, idempotent) and build the model."""
    problem_cls, model_cls, hparams, hp = resolve_names(problem, model, hparams, overrides)
    prob = problem_cls(data_dir=data_dir, raw_dir=raw_dir)  # a MultiProblem for "a,b,c"
    if prepare:
        prob.prepare()
    spec = prob.spec(hp)
    net = build_model(model_cls, hp, spec, device)
    info = {"problem": problem, "model": model, "hparams_set": hparams, "overrides": overrides or "",
            "data_dir": str(data_dir) if data_dir else None, "raw_dir": str(raw_dir) if raw_dir else None}
    return Run(prob, hp, spec, net, info)
