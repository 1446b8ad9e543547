"""The search's Optuna study: its storage, its record of what it searches, and its trials' states.

The study lives in an SQLAlchemy database (default ``sqlite:///DIR/study.db``), so every process
of a search (``--jobs K``) and every later run of the same command shares it. The study's user
attributes record the problem, model, hparams set, metric and mode; a run that names another is
refused. A trial records the pid and host of the process running it and its output directory; a
``RUNNING`` trial whose process is gone (killed by SIGKILL, a crash, a lost machine) is *stale*:
:func:`fail_stale_trials` marks it failed and enqueues its parameters again, so a fresh trial
re-runs them.
"""
from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import UserError

__all__ = ["SearchError", "StudyRecord", "open_study", "default_storage", "check_storage_url", "trial_dir",
           "trial_counts", "fail_stale_trials", "requeue", "claim_trial", "write_json", "DONE_STATES",
           "STALE_UNCLAIMED_SECONDS"]

#: a RUNNING trial without a recorded process counts as stale after this many seconds
STALE_UNCLAIMED_SECONDS = 60.0
_SCHEMES = ("sqlite", "postgresql", "mysql")
#: tries to open a storage whose tables another process is creating at the same moment
_OPEN_ATTEMPTS = 4


class SearchError(UserError):
    """A search that cannot start or go on: a bad storage, a study of another run, failing trials."""


@dataclass(frozen=True)
class StudyRecord:
    """What a study searches: checked when a later run opens it."""

    problem: str
    model: str
    hparams_set: str
    metric: str
    mode: str

    def to_dict(self) -> dict[str, str]:
        return {"problem": self.problem, "model": self.model, "hparams_set": self.hparams_set,
                "metric": self.metric, "mode": self.mode}


#: trial states that count towards ``--trials`` (names of ``optuna.trial.TrialState``)
DONE_STATES = ("COMPLETE", "PRUNED")


def default_storage(directory: Path) -> str:
    """``sqlite:///<absolute DIR>/study.db``."""
    return f"sqlite:///{(directory / 'study.db').resolve()}"


def check_storage_url(url: str) -> str:
    """An SQLAlchemy URL of a database Optuna can keep a study in (sqlite, postgresql, mysql)."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme.split("+", 1)[0] not in _SCHEMES:
        raise SearchError(f"--storage {url!r}: expected a database URL such as sqlite:///study.db "
                          f"(schemes: {', '.join(_SCHEMES)})")
    return url


def trial_dir(directory: Path, number: int) -> Path:
    """``DIR/trial_0007``: the output directory of trial ``number``."""
    return directory / f"trial_{number:04d}"


def _storage(url: str) -> Any:
    import optuna
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 60}}   # several processes write the one file
    attempt = 0
    while True:
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's and Optuna's errors are reported in one line
            # Optuna's CREATE TABLE can fail with "table ... already exists" when another opener
            # of the same database made the table meanwhile (seen in CI with --jobs 2): open again
            attempt += 1
            if "already exists" not in str(exc) or attempt >= _OPEN_ATTEMPTS:
                raise SearchError(f"--storage {url}: cannot open it ({type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:300]})") from None
            time.sleep(0.2 * attempt)


def open_study(url: str, name: str, record: StudyRecord, *, pruner: Any = None, sampler: Any = None) -> Any:
    """The study ``name`` in ``url`` (created if new); refused if it records another search."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _storage(check_storage_url(url))
    direction = "minimize" if record.mode == "min" else "maximize"
    study = optuna.create_study(storage=storage, study_name=name, direction=direction, load_if_exists=True,
                                pruner=pruner, sampler=sampler)
    if study.direction.name.lower() != direction:
        raise SearchError(f"study {name!r} in {url} {study.direction.name.lower()}s its metric; this search "
                          f"would {direction} it (--mode); pick another --study-name")
    saved = study.user_attrs
    for key, value in record.to_dict().items():
        if key not in saved:
            study.set_user_attr(key, value)
        elif saved[key] != value:
            raise SearchError(f"study {name!r} in {url} searches {key} {saved[key]!r}, not {value!r}; "
                              f"pick another --study-name or --storage")
    return study


def trial_counts(study: Any) -> Counter[str]:
    """Trial state name -> count (``COMPLETE``, ``PRUNED``, ``RUNNING``, ``FAIL``, ``WAITING``)."""
    return Counter(t.state.name for t in study.get_trials(deepcopy=False))


def claim_trial(trial: Any, directory: Path) -> None:
    """Record the process running ``trial`` and its output directory (for the stale check)."""
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("output_dir", str(trial_dir(directory, trial.number).resolve()))


def _lock_free(path: str | None) -> bool:
    from ..train.runlock import RunLockError, check_unlocked
    if not path or not Path(path).is_dir():
        return True
    try:
        check_unlocked(Path(path), 0.0, log=lambda message: None)
    except RunLockError:
        return False
    return True


def _is_stale(trial: Any, now: float) -> bool:
    attrs = trial.user_attrs
    started = trial.datetime_start.timestamp() if trial.datetime_start else now
    if "pid" not in attrs:
        return now - started > STALE_UNCLAIMED_SECONDS
    if attrs.get("host") == socket.gethostname():
        from ..train.runlock import _alive
        return int(attrs["pid"]) != os.getpid() and not _alive(int(attrs["pid"]))
    # another machine: its trial directory's run lock says whether it still trains
    return now - started > STALE_UNCLAIMED_SECONDS and _lock_free(attrs.get("output_dir"))


def requeue(study: Any, trial: Any, params: dict[str, Any]) -> None:
    """Enqueue ``params`` again (a fresh trial re-runs an interrupted one), noting which it repeats."""
    study.enqueue_trial(params, user_attrs={"rerun_of": trial.number})


def fail_stale_trials(study: Any, log: Callable[[str], None] = print) -> list[int]:
    """Mark failed every RUNNING trial whose process is gone and enqueue its parameters again."""
    from optuna.trial import TrialState
    failed = []
    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _is_stale(trial, now):
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError):   # another process finished it first
            continue
        requeue(study, trial, dict(trial.params))
        failed.append(trial.number)
        log(f"search: trial {trial.number} was running when its process died; marked failed, "
            f"its parameters run again")
    return failed


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically."""
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
