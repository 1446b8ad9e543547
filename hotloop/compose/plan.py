"""Deciding a run's Strategy, once, before the Trainer is built.

``StrategyRequest.parse("auto", {"precision": "bf16"}, device)`` checks what the user asked
for (``auto``, ``default``, a JSON file or a mapping of fields, plus typed overrides).
:func:`plan_strategy` turns it into the one concrete :class:`Strategy` that the Trainer, the
data-parallel context and the feeder all read, validated once here: for ``auto`` it runs the
autotuner (on the main rank of a multi-process job, which then shares the choice) and applies
the user's overrides on top. Downstream code trusts the planned Strategy
(:meth:`Strategy.validate` does not check it again).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..engine.strategy import Strategy, StrategyError
from ..hparams import HParams
from ..problems.base import Problem

__all__ = ["StrategyRequest", "plan_strategy", "auto_strategy", "planned_steps"]


@dataclass(frozen=True)
class StrategyRequest:
    """What the user asked for: tuning (``auto``) or a fixed ``base``, plus parsed overrides."""

    auto: bool = True
    base: Strategy = field(default_factory=Strategy)
    overrides: dict[str, Any] = field(default_factory=dict)   # typed Strategy field changes

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] = "auto", overrides: str | Mapping[str, Any] | None = None,
              device: torch.device | str = "cpu") -> "StrategyRequest":
        """``value``: ``auto``, ``default``, a JSON file or a mapping of Strategy fields;
        ``overrides``: typed field changes (a mapping), or the user's ``"k=v,..."`` text.

        What the user chose is checked here (names, types, hardware), before any tuning
        starts: the fixed Strategy, or under ``auto`` the overrides on the defaults.
        """
        if isinstance(value, Mapping):
            base = Strategy.from_mapping(value)
        else:
            base = Strategy() if value in ("auto", "default") else Strategy.from_file(value)
        changes = (Strategy.parse_overrides(overrides) if isinstance(overrides, str) or overrides is None
                   else Strategy.field_changes(overrides))
        request = cls(value == "auto", base, changes)
        if not request.auto or request.overrides:
            request.fixed().validate(device)
        return request

    def fixed(self) -> Strategy:
        """The base with the overrides applied (the Strategy when not tuning; the same object
        on every call, so a Strategy checked once stays checked)."""
        if "_fixed" not in self.__dict__:
            object.__setattr__(self, "_fixed", self.base.replace(**self.overrides) if self.overrides
                               else self.base)
        return self.__dict__["_fixed"]

    def on_top_of(self, tuned: Strategy) -> Strategy:
        """``tuned`` with the user's overrides applied (they always win)."""
        return tuned.replace(**self.overrides) if self.overrides else tuned


def planned_steps(problem: Problem, hp: HParams) -> int | None:
    """Steps of a run: ``max_steps``, else ``max_epochs`` x batches per epoch (None if unknown)."""
    if hp.max_steps:
        return int(hp.max_steps)
    if not hp.max_epochs:
        return None
    reader = problem.reader("train", hp)
    try:
        return int(hp.max_epochs) * max(1, len(reader) // max(1, hp.accum_steps))
    except TypeError:
        return None
    finally:
        close = getattr(reader, "close", None)
        if callable(close):
            close()


def auto_strategy(model: nn.Module, problem: Problem, hp: HParams, device: torch.device | str = "cpu", *,
                  planned: int | None = None, max_time: float | None = None,
                  log: Callable[[str], None] = print, **tune_options: Any) -> Strategy:
    """The autotuner's Strategy for this run (the one-liner before ``Trainer(strategy=...)``).

    ``planned`` defaults to :func:`planned_steps`; ``max_time`` (seconds) caps the planned
    run that the tuning budget is a fraction of. ``tune_options`` go to
    :func:`hotloop.tools.autotune.tune`.
    """
    from ..tools.autotune import tune
    steps = planned if planned is not None else planned_steps(problem, hp)
    report = tune(model, problem, hp, torch.device(device), steps, planned_seconds=max_time, log=log,
                  **tune_options)
    return report.strategy


def plan_strategy(request: StrategyRequest, *, model: nn.Module, problem: Problem, hp: HParams,
                  device: torch.device | str, max_time: float | None = None,
                  log: Callable[[str], None] = print, dist: Any = None) -> Strategy:
    """The run's one concrete Strategy: ``request.fixed()``, or the tuned one plus the overrides.

    In a multi-process job (``dist`` with ``world_size > 1``) only the main rank tunes;
    the other ranks receive its choice, so every rank runs the same step. There, unless the
    overrides fix ``data_parallel``, :func:`hotloop.tools.layout.choose_layout` picks DDP,
    ZeRO-1 or FSDP from the bytes a rank would hold (and a timed step where several fit).
    """
    if not request.auto:
        return request.fixed().validate(device)      # checked by StrategyRequest.parse: trusted
    distributed = dist is not None and dist.world_size > 1
    chosen = None
    if not distributed or dist.is_main:
        chosen = request.on_top_of(auto_strategy(model, problem, hp, device, max_time=max_time, log=log))
    if distributed:   # the main rank's choice, as JSON fields, for every rank
        text = dist.broadcast_text(json.dumps(chosen.to_dict()) if chosen is not None else None)
        chosen = Strategy.from_mapping(json.loads(text))
    assert chosen is not None
    if distributed and "data_parallel" not in request.overrides:   # DDP, ZeRO-1 or FSDP by memory
        from ..tools.layout import choose_layout
        chosen = choose_layout(chosen, model=model, problem=problem, hp=hp, device=device, dist_ctx=dist, log=log)
    try:
        return chosen.validate(device)
    except StrategyError as exc:
        raise StrategyError(f"the tuned strategy with your overrides does not apply: {exc}") from None
