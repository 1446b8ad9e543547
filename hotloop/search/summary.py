"""The end of a search: the table of trials, ``DIR/summary.json`` and ``DIR/best.json``.

``best.json`` is the best complete trial's ``run.json`` (a ``hotloop train --config`` file) with
its sampled hparams written as typed ``overrides`` and without its output directory, so
``hotloop train --config DIR/best.json --output-dir D`` repeats that trial.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .study import trial_dir, write_json

__all__ = ["trial_rows", "format_table", "best_trial", "write_best", "write_summary", "BEST_FILE", "SUMMARY_FILE"]

BEST_FILE = "best.json"
SUMMARY_FILE = "summary.json"


def _note(trial: Any, reruns: dict[int, int]) -> str:
    if trial.number in reruns:
        return f"interrupted; re-run as trial {reruns[trial.number]}"
    note = str(trial.user_attrs.get("message", ""))
    return note


def _output_dir(trial: Any, directory: Path) -> str:
    """Where the trial trained (as its process recorded it: another machine's directory too)."""
    return str(trial.user_attrs.get("output_dir") or trial_dir(directory, trial.number))


def trial_rows(study: Any, directory: Path) -> list[dict[str, Any]]:
    """One row per trial: number, state, value, steps, params, output_dir, note."""
    trials = study.get_trials(deepcopy=False)
    reruns = {int(t.user_attrs["rerun_of"]): t.number for t in trials if "rerun_of" in t.user_attrs}
    rows = []
    for t in trials:
        value = t.value
        if value is None and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        rows.append({"trial": t.number, "state": t.state.name, "value": value,
                     "steps": int(t.user_attrs.get("steps", 0)), "params": dict(t.params),
                     "output_dir": _output_dir(t, directory), "note": _note(t, reruns)})
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def format_table(rows: list[dict[str, Any]], metric: str, best: int | None = None) -> str:
    """The trials as a text table (``*`` marks the best); one line per trial."""
    names = list(dict.fromkeys(k for row in rows for k in row["params"]))
    head = ["trial", "state", metric, "steps", *names, "note"]
    body = [[f"{row['trial']}{'*' if row['trial'] == best else ''}", row["state"].lower(), _cell(row["value"]),
             str(row["steps"]), *(_cell(row["params"].get(n)) for n in names), row["note"]] for row in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *body])


def best_trial(study: Any) -> Any:
    """The best complete trial (None while no trial is complete)."""
    from optuna.trial import TrialState
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    return study.best_trial


def write_best(directory: Path, trial: Any) -> Path | None:
    """``DIR/best.json`` from the best trial's ``run.json`` (None when that file is missing)."""
    try:
        run = json.loads((Path(_output_dir(trial, directory)) / "run.json").read_text())
    except (OSError, ValueError):
        return None
    run.pop("output_dir", None)
    overrides = run.get("overrides") if isinstance(run.get("overrides"), dict) else {}
    run["overrides"] = {**overrides, **trial.params}
    path = directory / BEST_FILE
    write_json(path, run)
    return path


def write_summary(directory: Path, rows: list[dict[str, Any]], *, metric: str, mode: str, best: int | None,
                  storage: str, study_name: str, strategy_file: str) -> Path:
    """``DIR/summary.json``: the study, the Strategy file every trial used, the best trial and all rows."""
    path = directory / SUMMARY_FILE
    clean = [{**r, "value": r["value"] if r["value"] is None or math.isfinite(r["value"]) else str(r["value"])}
             for r in rows]
    write_json(path, {"storage": storage, "study_name": study_name, "metric": metric, "mode": mode,
                      "best_trial": best, "strategy_file": strategy_file, "trials": clean})
    return path
