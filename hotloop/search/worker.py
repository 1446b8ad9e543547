"""One search process's loop: ask the study for a trial, run it, tell the study how it ended.

Every process of a search (the command itself with ``--jobs 1``, else each of the ``K`` workers)
runs :func:`run_trials`. Asking is serialised between the processes of one output directory by
a file lock, so the study never starts more trials than ``--trials`` needs: a process asks only
while ``complete + pruned + running < N``. A trial that fails (bad hparams for the model, a
non-finite loss, an exception) is marked failed and the loop goes on; three failures in a row
stop it. A stop signal ends the loop: the running trial checkpoints, is marked failed and its
parameters are enqueued, so the next run of the command re-runs them in a fresh trial.
"""
from __future__ import annotations

import fcntl
import os
import signal
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..train.interrupt import StopSignalGuard, exit_code_for
from .reporter import TrialOutcome, TrialReporter
from .space import SearchSpace
from .study import SearchError, claim_trial, fail_stale_trials, requeue, trial_counts, trial_dir

__all__ = ["TrialRequest", "RunTrial", "run_trials", "MAX_FAILURES_IN_A_ROW", "ASK_LOCK"]

MAX_FAILURES_IN_A_ROW = 3
ASK_LOCK = ".search-ask.lock"


@dataclass(frozen=True)
class TrialRequest:
    """What a trial runs: its number, the sampled hparams, its directory and its reporter."""

    number: int
    params: dict[str, Any]
    output_dir: Path
    reporter: TrialReporter


#: runs one trial as a normal ``hotloop train`` and returns its exit code
RunTrial = Callable[[TrialRequest], int]


@contextmanager
def _ask_lock(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ASK_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _next_trial(study: Any, directory: Path, total: int, log: Callable[[str], None]) -> Any:
    """A new trial of ``study`` claimed by this process, or None when ``total`` are done or running."""
    with _ask_lock(directory):
        fail_stale_trials(study, log)
        counts = trial_counts(study)
        if counts["COMPLETE"] + counts["PRUNED"] + counts["RUNNING"] >= total:
            return None
        trial = study.ask()
        claim_trial(trial, directory)
        return trial


def _tell(study: Any, trial: Any, params: dict[str, Any], outcome: TrialOutcome, log: Callable[[str], None]) -> None:
    from optuna.trial import TrialState
    trial.set_user_attr("steps", outcome.steps)
    if outcome.message:
        trial.set_user_attr("message", outcome.message)
    value = "" if outcome.value is None else f" {outcome.value:.6g}"
    if outcome.state == "complete":
        study.tell(trial, outcome.value)
    elif outcome.state == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)
        if outcome.state == "interrupted":
            requeue(study, trial, params)
    log(f"search: trial {trial.number} {outcome.state}{value} after {outcome.steps} steps"
        + (f" ({outcome.message})" if outcome.message and outcome.state != "complete" else ""))


def run_trials(study: Any, space: SearchSpace, directory: Path, total: int, metric: str, run_trial: RunTrial,
               *, prune: bool = True, log: Callable[[str], None] = print) -> int:
    """Run trials of ``study`` until ``total`` are complete or pruned; returns the exit code
    (0, or ``128 + signal`` after a stop signal). Raises :class:`SearchError` when ``metric`` is
    not evaluated or trials keep failing."""
    received: list[int] = []
    failures = 0
    with StopSignalGuard(received.append):
        while not received:
            trial = _next_trial(study, directory, total, log)
            if trial is None:
                return 0
            params: dict[str, Any] = {}
            reporter = TrialReporter(trial, metric, prune=prune,
                                     pending_signal=lambda: received[0] if received else None)
            try:
                params = space.suggest(trial)
                out = trial_dir(directory, trial.number)
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
                log(f"search: trial {trial.number}: {shown} -> {out}")
                code = run_trial(TrialRequest(trial.number, params, out, reporter))
                outcome = reporter.outcome(code)
            except KeyboardInterrupt as exc:   # a second signal: stop at once
                _tell(study, trial, params, TrialOutcome("interrupted", reporter.value, 0, "stopped by a signal"),
                      log)
                raise SearchInterrupted(int(getattr(exc, "exit_code", 130))) from None
            except Exception as exc:  # noqa: BLE001 - a trial's failure is the trial's, not the search's
                message = " ".join(f"{type(exc).__name__}: {exc}".split())
                if not isinstance(exc, SearchError) and os.environ.get("HOTLOOP_SEARCH_TRACEBACK"):
                    traceback.print_exc()
                outcome = TrialOutcome("fail", reporter.value, 0, message, 1)
            if reporter.missing:
                _tell(study, trial, params, TrialOutcome("fail", None, outcome.steps, reporter.missing, 2), log)
                raise SearchError(reporter.missing)
            _tell(study, trial, params, outcome, log)
            if outcome.state == "interrupted":
                return outcome.exit_code
            failures = failures + 1 if outcome.state == "fail" else 0
            if failures >= MAX_FAILURES_IN_A_ROW:
                raise SearchError(f"{failures} trials in a row failed; the last: {outcome.message}")
    return exit_code_for(received[0]) if received else int(signal.SIGINT) + 128


class SearchInterrupted(KeyboardInterrupt):
    """The search stopped by a second signal; ``exit_code`` is ``128 + signum``."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"exit {exit_code}")
        self.exit_code = exit_code
