"""``hotloop search`` end to end on a tiny problem: kill and resume, pruning, --jobs 2, no orphans."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from hotloop import cli

import optuna  # noqa: E402 - in the [test] extra: a broken install fails, never skips
from optuna.trial import TrialState  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = "hidden_size=8,filter_size=16,batch_size=8,eval_examples=32,train_examples=100000,warmup_steps=0"
SPACE = ("learning_rate: {type: float, low: 1e-6, high: 3e-2, log: true}\n"
         "dropout: {type: choice, values: [0.0, 0.1]}\n")

pytestmark = pytest.mark.timeout(240)


def _argv(out: Path, trials: int, steps: int, every: int, *extra: str) -> list[str]:
    space = out.parent / "space.yaml"
    space.write_text(SPACE)
    return ["search", "--problem", "algorithmic_reverse", "--model", "mlp", "--hparams", "mlp_algorithmic",
            "--override", TINY, "--max-steps", str(steps), "--eval-every", str(every), "--strategy", "default",
            "--loggers", "jsonl", "--space", str(space), "--trials", str(trials), "--output-dir", str(out),
            "--device", "cpu", *extra]


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=out.name, storage=f"sqlite:///{out / 'study.db'}")


def _states(study: optuna.Study) -> dict[int, str]:
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def _study_ready(out: Path) -> bool:
    """Whether the search process has finished creating ``study.db`` (its schema version stamped), read
    without writing: ``optuna.load_study`` on a half-created file stamps the version itself and races
    the search process (sqlite UNIQUE constraint failed: alembic_version)."""
    db = out / "study.db"
    if not db.is_file():
        return False
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def _trial_state(out: Path, number: int) -> str | None:
    """Trial ``number``'s state, or None while the study is still being created."""
    if not _study_ready(out):
        return None
    try:
        return _states(_study(out)).get(number)
    except Exception:  # noqa: BLE001 - the study row is still being written
        return None


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "hotloop", *argv], stdout=f, stderr=subprocess.STDOUT,
                                env=env, cwd=str(REPO))


def _wait_for(condition, proc: subprocess.Popen, log: Path, timeout: float = 150.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"the search exited with {proc.returncode} first:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"timed out:\n{log.read_text()[-3000:]}")


def _running_with_checkpoint(out: Path, count: int):
    def check() -> bool:
        if not _study_ready(out):
            return False
        try:
            running = _study(out).get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        except Exception:  # noqa: BLE001 - the study is still being created
            return False
        ready = [t for t in running if "pid" in t.user_attrs and
                 list((out / f"trial_{t.number:04d}" / "checkpoints").glob("step-*.ckpt"))]
        return len({t.user_attrs["pid"] for t in ready}) >= count
    return check


def test_a_killed_search_resumes_to_six_trials_and_best_json_repeats_the_best(tmp_path, capsys):
    out = tmp_path / "s"
    proc = _spawn(_argv(out, 4, 60, 20), tmp_path / "first.log")
    # SIGKILL while trial 1 runs (it has written a checkpoint): nothing marks it finished
    _wait_for(lambda: _trial_state(out, 0) == "COMPLETE", proc, tmp_path / "first.log")
    _wait_for(_running_with_checkpoint(out, 1), proc, tmp_path / "first.log")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    killed = [n for n, s in _states(_study(out)).items() if s == "RUNNING"]
    assert len(killed) == 1
    assert cli.main(_argv(out, 6, 30, 10)) == 0
    printed = capsys.readouterr().out
    study = _study(out)
    trials = study.get_trials()
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) == 6
    # the killed trial is marked failed and its parameters run again in a fresh trial
    assert trials[killed[0]].state == TrialState.FAIL
    rerun = [t for t in trials if t.user_attrs.get("rerun_of") == killed[0]]
    assert len(rerun) == 1 and rerun[0].params == trials[killed[0]].params
    assert "was running when its process died" in printed and "re-run as trial" in printed
    for t in done:
        run = out / f"trial_{t.number:04d}"
        assert (run / "run.json").is_file() and list((run / "checkpoints").glob("step-*.ckpt"))
        assert json.loads((run / "run.json").read_text())["strategy"] == json.loads(
            (out / "strategy.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_trial"] == study.best_trial.number and len(summary["trials"]) == len(trials)
    assert f"{study.best_trial.number}*" in printed
    # hotloop train --config best.json builds the best trial's hparams
    repeat = tmp_path / "repeat"
    assert cli.main(["train", "--config", str(out / "best.json"), "--output-dir", str(repeat)]) == 0
    best = json.loads((out / f"trial_{study.best_trial.number:04d}" / "hparams.json").read_text())
    overrides = json.loads((out / "best.json").read_text())["overrides"]
    assert all(overrides[k] == v for k, v in study.best_trial.params.items())     # typed, as sampled
    assert json.loads((repeat / "hparams.json").read_text()) == best


def test_a_clearly_bad_trial_is_pruned_and_keeps_its_directory(tmp_path, capsys):
    out = tmp_path / "p"
    out.mkdir()
    study = optuna.create_study(study_name="p", storage=f"sqlite:///{out / 'study.db'}", direction="minimize")
    for lr in (1e-2, 2e-2, 1.5e-2):
        study.enqueue_trial({"learning_rate": lr, "dropout": 0.0})
    study.enqueue_trial({"learning_rate": 1e-6, "dropout": 0.0})       # barely moves: worse than the median
    assert cli.main(_argv(out, 4, 40, 10, "--prune-startup", "3")) == 0
    assert "pruned" in capsys.readouterr().out
    trials = _study(out).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED]
    pruned = trials[3]
    assert pruned.user_attrs["steps"] < 40 and "pruned by the search" in pruned.user_attrs["message"]
    assert list((out / "trial_0003" / "checkpoints").glob("step-*.ckpt"))


def test_jobs_2_share_the_study_and_sigterm_leaves_no_process(tmp_path, capsys):
    out = tmp_path / "j"
    log = tmp_path / "jobs.log"
    proc = _spawn(_argv(out, 4, 400, 20, "--jobs", "2"), log)
    _wait_for(_running_with_checkpoint(out, 2), proc, log)
    workers = {t.user_attrs["pid"] for t in _study(out).get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    assert len(workers) == 2 and proc.pid not in workers
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 143, log.read_text()[-3000:]
        for pid in workers:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:   # a failed check leaves nothing running
        for pid in [proc.pid, *workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(30)
    interrupted = [t for t in _study(out).get_trials() if t.state == TrialState.FAIL]
    assert len(interrupted) == 2 and not _study(out).get_trials(states=(TrialState.RUNNING,))
    assert len(_study(out).get_trials(states=(TrialState.WAITING,))) == 2      # their parameters, enqueued again
    # the rerun continues with two worker processes until 4 trials are done
    assert cli.main(_argv(out, 4, 40, 20, "--jobs", "2")) == 0
    trials = _study(out).get_trials()
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) == 4 and os.getpid() not in {t.user_attrs["pid"] for t in done}
    assert {t.user_attrs.get("rerun_of") for t in trials} >= {t.number for t in interrupted}
    assert (out / "logs" / "worker_0.log").is_file() and (out / "best.json").is_file()
