"""Loggers chosen by name: CSV files, and W&B / MLflow against stand-in modules that record calls.

The real ``wandb`` and ``mlflow`` packages are not installed here; the stand-ins implement
the part of their public APIs the loggers use, so these tests check what the loggers
call, not the services.
"""
from __future__ import annotations

import csv
import json
import sys
import types

import pytest

from helpers import make_trainer
from hotloop.errors import UserError
from hotloop.engine import Strategy
from hotloop.train.loggers import CsvLogger, JsonlLogger
from hotloop.train.tracking import MlflowLogger, WandbLogger, build_loggers, parse_logger_names

pytestmark = pytest.mark.timeout(300)


def _fake_wandb(calls: list) -> types.ModuleType:
    module = types.ModuleType("wandb")

    class Summary(dict):
        def update(self, values):  # noqa: D401 - records like the real run.summary
            calls.append(("summary", dict(values)))
            super().update(values)

    class Run:
        summary = Summary()

        def log(self, data, step=None):
            calls.append(("log", step, dict(data)))

        def finish(self, exit_code=None):
            calls.append(("finish", exit_code))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    module.init = init
    return module


def _fake_mlflow(calls: list) -> types.ModuleType:
    module = types.ModuleType("mlflow")
    for name in ("set_tracking_uri", "set_experiment", "log_params", "set_tag"):
        setattr(module, name, lambda *a, _n=name, **k: calls.append((_n, a, k)))

    def start_run(run_id=None, run_name=None):
        calls.append(("start_run", run_id, run_name))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id or "run-1"))

    module.start_run = start_run
    module.log_metrics = lambda metrics, step=None: calls.append(("log_metrics", step, dict(metrics)))
    module.end_run = lambda status="FINISHED": calls.append(("end_run", status))
    return module


def test_csv_matches_jsonl_and_drops_rows_after_the_resumed_step(tmp_path):
    out = tmp_path / "r"
    loggers = lambda: [CsvLogger(out / "csv"), JsonlLogger(out / "metrics.jsonl")]  # noqa: E731
    make_trainer(out, max_steps=6, eval_every=3, loggers=loggers(), strategy=Strategy(prefetch=0, sync_every=2)).fit()
    jsonl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    with open(out / "csv" / "train.csv", newline="") as f:
        train = list(csv.DictReader(f))
    expected = [r for r in jsonl if r["split"] == "train"]
    assert [int(r["step"]) for r in train] == [r["step"] for r in expected] == [2, 4, 6]
    assert [float(r["loss"]) for r in train] == [r["loss"] for r in expected]
    with open(out / "csv" / "valid.csv", newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [3, 6]
    # a run resumed from step 3 (the step-6 checkpoint removed) rewrites the rows after it
    (out / "checkpoints" / "step-00000006.ckpt").unlink()
    make_trainer(out, max_steps=4, eval_every=3, loggers=loggers(),
                 strategy=Strategy(prefetch=0, sync_every=2)).fit(resume=True)
    with open(out / "csv" / "train.csv", newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [2, 4]


def test_wandb_logger_calls_the_public_api(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    logger = WandbLogger(name="tiny", config={"model": "transformer"}, directory=tmp_path / "r")
    result = make_trainer(tmp_path / "r", max_steps=4, eval_every=2, loggers=[logger],
                          strategy=Strategy(prefetch=0, sync_every=2)).fit()
    init = calls[0]
    assert init[0] == "init" and init[1]["project"] == "hotloop" and init[1]["name"] == "tiny"
    assert init[1]["id"] == logger.run_id and init[1]["resume"] == "allow"
    logged = [c for c in calls if c[0] == "log"]
    assert [c[1] for c in logged if "train/loss" in c[2]] == [2, 4]
    assert [c[1] for c in logged if "valid/loss" in c[2]] == [2, 4]
    assert ("summary", {"steps": 4, "stop_reason": "max_steps", "best_checkpoint": result.best_checkpoint}) in calls
    assert calls[-1] == ("finish", None)
    assert logger.state_dict() == {"run_id": logger.run_id}   # checkpointed: a resume continues the run


def test_mlflow_logger_calls_the_public_api(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "mlflow", _fake_mlflow(calls))
    logger = build_loggers("mlflow", tmp_path / "r", run_name="tiny", config={"lr": 0.1}, console=False)[0]
    assert isinstance(logger, MlflowLogger)
    make_trainer(tmp_path / "r", max_steps=4, loggers=[logger], strategy=Strategy(prefetch=0, sync_every=2)).fit()
    names = [c[0] for c in calls]
    assert names[:4] == ["set_tracking_uri", "set_experiment", "start_run", "log_params"]
    assert calls[0][1][0].startswith("file:") and calls[0][1][0].endswith("/r/mlruns")
    assert calls[3][1][0] == {"lr": "0.1"}
    assert [c[1] for c in calls if c[0] == "log_metrics" and "train/loss" in c[2]] == [2, 4]
    assert calls[-1] == ("end_run", "FINISHED")


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_missing_package_gives_the_install_hint(monkeypatch, tmp_path, package):
    monkeypatch.setitem(sys.modules, package, None)   # import fails
    with pytest.raises(UserError, match=rf"pip install 'hotloop\[{package}\]'"):
        build_loggers(package, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_logger_names():
    assert parse_logger_names("csv, jsonl,csv") == ["csv", "jsonl"]
    assert parse_logger_names("none") == []
    with pytest.raises(UserError, match="unknown logger 'tensorbord'; loggers: jsonl, csv, tensorboard"):
        parse_logger_names("jsonl,tensorbord")
