"""Helpers of the multi-problem tests (imported as ``from mm_helpers import ...``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hotloop.engine import Strategy
from hotloop.train import Trainer
from hotloop.compose.build import build_run, run_callbacks
from hotloop.train.loggers import default_loggers

__all__ = ["PROBLEMS", "TINY", "tiny_run", "make_multi_trainer"]

PROBLEMS = "algorithmic_copy,algorithmic_reverse,image_synthetic"
TINY = "hidden_size=16,filter_size=32,num_heads=2,batch_size=8,train_examples=48,eval_examples=16"


def tiny_run(extra: str = "", problems: str = PROBLEMS) -> Any:
    """``build_run`` of ``problems`` on ``multimodel_tiny`` shrunk further, plus ``extra`` overrides."""
    return build_run(problems, "multimodel", "multimodel_tiny", TINY + ("," + extra if extra else ""))


def make_multi_trainer(out: Path | None, extra: str = "", *, strategy: Strategy | None = None,
                       problems: str = PROBLEMS, **kwargs: Any) -> Trainer:
    """A Trainer of a fresh :func:`tiny_run` (the same weights every time) with the run's callbacks."""
    run = tiny_run(extra, problems)
    kwargs.setdefault("loggers", default_loggers(out, console=False))
    callbacks = list(kwargs.pop("callbacks", ())) + run_callbacks(run.problem)
    return Trainer(run.problem, run.model, run.hp, strategy=strategy or Strategy(prefetch=0),
                   output_dir=out, callbacks=callbacks, **kwargs)
