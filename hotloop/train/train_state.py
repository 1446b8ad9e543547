"""`TrainState`: what the training loop itself owns and a checkpoint must carry.

The step and epoch counters, the model state carried across batches (streamed LM
problems), the last evaluation's metrics and the step that evaluation ran at. Its
``state_dict`` holds tensors and plain data; ``load_state_dict`` moves the carried
state to the run's device. :class:`TrainStateField` shows one of its fields as an
attribute of the object that holds it (``trainer.step`` is ``trainer.train_state.step``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .feeding import to_device

__all__ = ["TrainState", "TrainStateField"]


@dataclass
class TrainState:
    """The loop's counters and carried state; ``device`` is where the carried state lives."""

    device: torch.device
    step: int = 0                     # optimizer steps taken
    epoch: int = 0                    # current epoch (= completed epochs)
    carried: Any = None               # carried model state (streamed LM problems), else None
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)   # split -> last evaluation
    last_eval_step: int = -1          # the step the last evaluation ran at

    @property
    def evaluated(self) -> bool:
        """Whether this step has been evaluated already."""
        return self.last_eval_step == self.step

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "carried": self.carried,
                "metrics": {split: dict(values) for split, values in self.metrics.items()},
                "evaluated": self.evaluated}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters; a checkpoint evaluated at its step is not evaluated again."""
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.metrics = {split: dict(values) for split, values in (state.get("metrics") or {}).items()}
        if state.get("evaluated"):
            self.last_eval_step = self.step
        self.carried = to_device(state.get("carried"), self.device)


class TrainStateField:
    """A class attribute that reads and writes field ``name`` of the instance's ``train_state``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.train_state, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj.train_state, self.name, value)
