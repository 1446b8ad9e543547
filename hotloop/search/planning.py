"""The search's one speed Strategy: planned once, stored in ``DIR/strategy.json``, read by every trial.

The first run of a search resolves ``--strategy`` (``auto`` tunes on the base hparams, the set
plus ``--override``, before any trial; ``default`` or a file is taken as it is) with
``--strategy-override`` and ``--precision`` applied, and writes the concrete Strategy to
``DIR/strategy.json``. Every trial then runs ``hotloop train --strategy DIR/strategy.json``, and
a later run of the command reuses the file (delete it to plan again); asking for overrides that
the stored Strategy does not have is an error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..compose.build import build_model
from ..compose.plan import StrategyRequest, plan_strategy
from ..engine.strategy import Strategy
from .study import SearchError, write_json

__all__ = ["STRATEGY_FILE", "search_strategy"]

STRATEGY_FILE = "strategy.json"


def _check_stored(path: Path, stored: Strategy, request: StrategyRequest) -> None:
    differ = {k: v for k, v in request.overrides.items() if getattr(stored, k) != v}
    if differ:
        asked = ", ".join(f"{k}={v}" for k, v in differ.items())
        raise SearchError(f"{path} (the Strategy planned for this search) differs from {asked}; "
                          f"delete it to plan the Strategy again")


def search_strategy(directory: Path, request: StrategyRequest, *, problem: Any, model_cls: type, hp: Any,
                    device: str, max_time: float | None = None, log: Callable[[str], None] = print) -> Path:
    """``DIR/strategy.json``: reused when present, else planned now (once for the whole search)."""
    path = directory / STRATEGY_FILE
    if path.is_file():
        stored = Strategy.from_file(path).validate(device)
        _check_stored(path, stored, request)
        log(f"search: every trial uses the Strategy planned before, {path}")
        return path
    if request.auto:
        model = build_model(model_cls, hp, problem.spec(hp), device)
        strategy = plan_strategy(request, model=model, problem=problem, hp=hp, device=device, max_time=max_time,
                                 log=log)
        del model
    else:
        strategy = plan_strategy(request, model=None, problem=problem, hp=hp, device=device)  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    write_json(path, strategy.to_dict())
    log(f"search: the Strategy is planned once, for every trial: {path}")
    return path
