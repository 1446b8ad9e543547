"""Experiment trackers (Weights & Biases, MLflow) and choosing loggers by name.

``wandb`` and ``mlflow`` are optional (extras ``hotloop[wandb]``, ``hotloop[mlflow]``);
each logger imports its package when built and names the install command when it
is missing. Both are written against the packages' public APIs
(``wandb.init / run.log / run.summary / run.finish``; ``mlflow.set_tracking_uri /
set_experiment / start_run / log_params / log_metrics / end_run``). The tests run
them against stand-in modules that record the calls, not the real packages; for an
offline W&B run set ``WANDB_MODE=offline``, and MLflow writes to a local store
under the output directory unless ``MLFLOW_TRACKING_URI`` is set.

:func:`build_loggers` turns ``"jsonl,csv,tensorboard,wandb,mlflow"`` into callbacks
(console lines and the progress bar are always on).
"""
from __future__ import annotations

import importlib
import math
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import UserError
from .events import Callback, Event
from .loggers import ConsoleLogger, CsvLogger, JsonlLogger, ProgressBar, TensorBoardLogger

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

__all__ = ["WandbLogger", "MlflowLogger", "LOGGER_NAMES", "DEFAULT_LOGGERS", "parse_logger_names",
           "build_loggers"]

LOGGER_NAMES = ("jsonl", "csv", "tensorboard", "wandb", "mlflow", "none")
DEFAULT_LOGGERS = "jsonl,tensorboard"


def _require(package: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError:
        raise UserError(f"the {package} logger needs the {package} package: "
                        f"pip install 'hotloop[{package}]' (or pip install {package})") from None


def _numbers(values: dict[str, Any], prefix: str) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch")
            and math.isfinite(v)}


class WandbLogger(Callback):
    """Logs rows and evaluations to a W&B run; a resumed fit continues the same run (id checkpointed)."""

    def __init__(self, project: str | None = None, name: str | None = None,
                 config: dict[str, Any] | None = None, directory: str | Path | None = None) -> None:
        self.wandb = _require("wandb")
        self.project = project or os.environ.get("WANDB_PROJECT") or "hotloop"
        self.name, self.config, self.directory = name, dict(config or {}), directory
        self.run_id = uuid.uuid4().hex[:12]
        self.run: Any = None

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START:
            if self.directory is not None:
                Path(self.directory).mkdir(parents=True, exist_ok=True)
            self.run = self.wandb.init(project=self.project, name=self.name, id=self.run_id, resume="allow",
                                       config=self.config, dir=None if self.directory is None else str(self.directory))
        elif self.run is None:
            return
        elif event is Event.LOG:
            self.run.log(_numbers(info["row"], "train"), step=trainer.step)
        elif event is Event.EVAL_END:
            self.run.log(_numbers(info["metrics"], info["split"]), step=trainer.step)
        elif event is Event.FIT_END:
            result = info["result"]
            self.run.summary.update({"steps": result.steps, "stop_reason": result.stop_reason,
                                     "best_checkpoint": result.best_checkpoint or ""})
            self.run.finish()
            self.run = None
        elif event is Event.INTERRUPT:
            self.run.finish(exit_code=1)
            self.run = None

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = str(state.get("run_id", self.run_id))


class MlflowLogger(Callback):
    """Logs params, rows and evaluations to an MLflow run; a resumed fit continues the same run."""

    def __init__(self, experiment: str | None = None, name: str | None = None,
                 params: dict[str, Any] | None = None, tracking_uri: str | None = None) -> None:
        self.mlflow = _require("mlflow")
        self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "hotloop"
        self.name, self.params, self.tracking_uri = name, dict(params or {}), tracking_uri
        self.run_id: str | None = None
        self.active = False

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        mlflow = self.mlflow
        if event is Event.FIT_START:
            if self.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
                mlflow.set_tracking_uri(self.tracking_uri)
            mlflow.set_experiment(self.experiment)
            run = mlflow.start_run(run_id=self.run_id, run_name=None if self.run_id else self.name)
            self.run_id, self.active = run.info.run_id, True
            if not info.get("resumed"):
                mlflow.log_params({k: str(v)[:500] for k, v in self.params.items()})
        elif not self.active:
            return
        elif event is Event.LOG:
            mlflow.log_metrics(_numbers(info["row"], "train"), step=trainer.step)
        elif event is Event.EVAL_END:
            mlflow.log_metrics(_numbers(info["metrics"], info["split"]), step=trainer.step)
        elif event in (Event.FIT_END, Event.INTERRUPT):
            if event is Event.FIT_END and info["result"].best_checkpoint:
                mlflow.set_tag("best_checkpoint", info["result"].best_checkpoint)
            mlflow.end_run(status="FINISHED" if event is Event.FIT_END else "KILLED")
            self.active = False

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id") or self.run_id


def parse_logger_names(names: str | Sequence[str] | None) -> list[str]:
    """``"jsonl,csv"`` (or a list) -> checked names; ``none`` selects no file/service logger."""
    if names is None:
        names = DEFAULT_LOGGERS
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in items if n not in LOGGER_NAMES]
    if unknown:
        raise UserError(f"unknown logger {unknown[0]!r}; loggers: {', '.join(LOGGER_NAMES)}")
    return [n for n in dict.fromkeys(items) if n != "none"]


def build_loggers(names: str | Sequence[str] | None, output_dir: str | Path | None, *,
                  run_name: str | None = None, config: dict[str, Any] | None = None,
                  console: bool = True) -> list[Callback]:
    """Console + progress bar, then the named loggers (files under ``output_dir``)."""
    chosen = parse_logger_names(names)
    out: list[Callback] = [ConsoleLogger(), ProgressBar()] if console else []
    directory = Path(output_dir) if output_dir is not None else None
    for name in chosen:
        if name == "wandb":
            out.append(WandbLogger(name=run_name, config=config, directory=directory))
        elif name == "mlflow":
            uri = (directory / "mlruns").resolve().as_uri() if directory is not None else None
            out.append(MlflowLogger(name=run_name, params=config, tracking_uri=uri))
        elif directory is None:
            continue
        elif name == "jsonl":
            out.append(JsonlLogger(directory / "metrics.jsonl"))
        elif name == "csv":
            out.append(CsvLogger(directory / "csv"))
        elif name == "tensorboard":
            out.append(TensorBoardLogger(directory / "tb"))
    return out
