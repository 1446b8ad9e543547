"""The study's bookkeeping without training: stale trials, the study record, the reporter's decisions."""
from __future__ import annotations

import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from optuna.trial import TrialState  # noqa: E402

from hotloop.search.reporter import TrialReporter  # noqa: E402
from hotloop.search.study import SearchError, StudyRecord, claim_trial, fail_stale_trials, open_study  # noqa: E402
from hotloop.search.summary import format_table, trial_rows  # noqa: E402
from hotloop.train.events import Event  # noqa: E402

RECORD = StudyRecord("algorithmic_reverse", "mlp", "mlp_algorithmic", "loss", "min")


def _url(tmp_path):
    return f"sqlite:///{tmp_path / 'study.db'}"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_running_trial_whose_process_is_gone_is_failed_and_its_params_enqueued(tmp_path):
    study = open_study(_url(tmp_path), "s", RECORD)
    dead = study.ask()
    dead.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
    dead.set_user_attr("pid", _dead_pid())
    dead.set_user_attr("host", socket.gethostname())
    alive = study.ask()
    claim_trial(alive, tmp_path)                       # this process: not stale
    unclaimed = study.ask()                            # asked a moment ago, not claimed yet: not stale
    lines = []
    assert fail_stale_trials(study, lines.append) == [dead.number]
    states = {t.number: t.state for t in study.get_trials()}
    assert states[dead.number] == TrialState.FAIL
    assert states[alive.number] == states[unclaimed.number] == TrialState.RUNNING
    waiting = study.get_trials(states=(TrialState.WAITING,))
    fixed = waiting[0].system_attrs["fixed_params"]
    assert len(waiting) == 1 and fixed == {"learning_rate": dead.params["learning_rate"]}
    assert waiting[0].user_attrs["rerun_of"] == dead.number and "process died" in lines[0]
    assert fail_stale_trials(study, lines.append) == []          # once only
    rows = trial_rows(study, tmp_path)
    assert rows[dead.number]["note"] == f"interrupted; re-run as trial {waiting[0].number}"
    assert "interrupted; re-run" in format_table(rows, "loss")


def test_a_study_of_another_search_is_refused(tmp_path):
    open_study(_url(tmp_path), "s", RECORD)
    with pytest.raises(SearchError, match="searches model 'mlp', not 'transformer'"):
        open_study(_url(tmp_path), "s", StudyRecord("algorithmic_reverse", "transformer", "mlp_algorithmic",
                                                    "loss", "min"))
    with pytest.raises(SearchError, match="minimizes its metric"):
        open_study(_url(tmp_path), "s", StudyRecord(*[*RECORD.to_dict().values()][:4], "max"))
    with pytest.raises(SearchError, match="expected a database URL"):
        open_study("study.db", "s", RECORD)


def test_tables_made_by_another_process_meanwhile_are_opened_again(tmp_path, monkeypatch):
    """Optuna's CREATE TABLE racing another process of the search: a second try opens the study;
    any other failure is one clear line."""
    import optuna
    calls = []

    class Racing(optuna.storages.RDBStorage):       # a subclass: Optuna checks isinstance
        def __init__(self, url, **kwargs):
            calls.append(url)
            if len(calls) == 1:
                raise RuntimeError("(sqlite3.OperationalError) table studies already exists")
            super().__init__(url, **kwargs)
    monkeypatch.setattr(optuna.storages, "RDBStorage", Racing)
    study = open_study(_url(tmp_path), "s", RECORD)
    assert len(calls) == 2 and study.study_name == "s"

    class Broken(optuna.storages.RDBStorage):
        def __init__(self, url, **kwargs):
            raise RuntimeError("unable to open database file")
    monkeypatch.setattr(optuna.storages, "RDBStorage", Broken)
    with pytest.raises(SearchError, match="cannot open it .*unable to open database file"):
        open_study(_url(tmp_path), "s", RECORD)


class _Trainer:
    def __init__(self, step, max_steps=100):
        self.step, self.max_steps, self.eval_splits = step, max_steps, ("valid", "test")
        self.stops = []
        self.stopper = SimpleNamespace(on_signal=lambda signum: self.stops.append(("signal", signum)))

    def request_stop(self, reason):
        self.stops.append(reason)


class _Trial:
    def __init__(self, prune):
        self.prune, self.reports = prune, []

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return self.prune


def test_the_reporter_reports_valid_and_stops_a_pruned_run():
    trial = _Trial(prune=True)
    reporter = TrialReporter(trial, "loss")
    trainer = _Trainer(step=10)
    reporter.on_event(Event.EVAL_END, trainer, split="test", metrics={"loss": 9.0})
    assert trial.reports == [] and trainer.stops == []
    reporter.on_event(Event.EVAL_END, trainer, split="valid", metrics={"loss": 2.5, "accuracy": 0.1})
    assert trial.reports == [(10, 2.5)] and "pruned by the search at step 10" in trainer.stops[0]
    reporter.on_event(Event.FIT_END, trainer, result=SimpleNamespace(steps=10, stop_reason="stopped: " +
                                                                     trainer.stops[0]))
    outcome = reporter.outcome(0)
    assert (outcome.state, outcome.value, outcome.steps) == ("pruned", 2.5, 10)


def test_the_reporter_does_not_prune_at_the_last_step_and_names_a_missing_metric():
    trial = _Trial(prune=True)
    reporter = TrialReporter(trial, "loss")
    last = _Trainer(step=100, max_steps=100)
    reporter.on_event(Event.EVAL_END, last, split="valid", metrics={"loss": 2.0})
    reporter.on_event(Event.FIT_END, last, result=SimpleNamespace(steps=100, stop_reason="max_steps"))
    assert last.stops == [] and reporter.outcome(0).state == "complete"
    assert reporter.outcome(143).state == "interrupted" and reporter.outcome(2).state == "fail"
    missing = TrialReporter(_Trial(prune=False), "bleu")
    missing.on_event(Event.EVAL_END, last, split="valid", metrics={"loss": 2.0, "accuracy": 0.3})
    assert missing.missing == "--metric 'bleu' is not a valid metric; valid metrics: accuracy, loss"
    signalled = TrialReporter(_Trial(prune=False), "loss", pending_signal=lambda: 15)
    signalled.on_event(Event.FIT_START, last, resumed=False)
    assert last.stops[-1] == ("signal", 15)
