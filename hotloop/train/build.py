"""Build a run's components from registry names (shared by the CLI and the tools).

``build_run("algorithmic_reverse", "transformer")`` resolves names (clear
errors for typos), applies overrides, checks the model serves the problem's
task, prepares missing data and builds the seeded model.
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

__all__ = ["Run", "resolve_names", "build_run", "build_model"]


@dataclass
class Run:
    problem: Problem
    hp: HParams
    spec: ProblemSpec
    model: nn.Module
    info: dict[str, Any] = field(default_factory=dict)  # names, overrides, data dirs (JSON)


def resolve_names(problem: str, model: str, hparams: str | None = None,
                  overrides: str | None = None) -> tuple[type, type, str, HParams]:
    """Look up the problem and model classes and the hparams set (default: the problem's
    ``default_hparams``); apply overrides; check the model serves the problem's task.
    Imports code but builds nothing."""
    problem_cls = problems.get(problem)
    model_cls = models.get(model)
    if not hparams:
        hparams = getattr(problem_cls, "default_hparams", "")
        if not hparams:
            raise HParamsError(f"problem {problem!r} has no default hparams set; pass --hparams "
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


def build_run(problem: str, model: str, hparams: str | None = None, overrides: str | None = None, *,
              data_dir: str | Path | None = None, raw_dir: str | Path | None = None,
              device: str | torch.device = "cpu", prepare: bool = True) -> Run:
    """Resolve, prepare data (``problem.prepare()``, idempotent) and build the model."""
    problem_cls, model_cls, hparams, hp = resolve_names(problem, model, hparams, overrides)
    prob = problem_cls(data_dir=data_dir, raw_dir=raw_dir)
    if prepare:
        prob.prepare()
    spec = prob.spec(hp)
    net = build_model(model_cls, hp, spec, device)
    info = {"problem": problem, "model": model, "hparams_set": hparams, "overrides": overrides or "",
            "data_dir": str(data_dir) if data_dir else None, "raw_dir": str(raw_dir) if raw_dir else None}
    return Run(prob, hp, spec, net, info)
