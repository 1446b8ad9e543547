"""`Precision`: the one owner of autocast, loss scaling and the scaler's state.

The step, graph capture, the phased step and evaluation all enter autocast
through it; loss scaling (fp16 on CUDA) is a scaler that does nothing when
off, so no caller branches on it. ``state_dict`` / ``load_state_dict`` carry
the scaler's state into checkpoints.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

__all__ = ["Precision", "PRECISIONS"]

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast for ``precision`` on ``device`` (a no-op context for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


class Precision:
    """Autocast and loss scaling for one run: ``precision`` ("fp32" | "bf16" | "fp16") on ``device``.

    fp16 on CUDA scales the loss (``torch.amp.GradScaler``); everywhere else the scaler
    methods pass through: ``backward`` is ``loss.backward()``, ``unscale`` does nothing,
    ``step`` is ``optimizer.step()``.
    """

    def __init__(self, precision: str, device: torch.device | str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}; choose one of {list(PRECISIONS)}")
        self.name = precision
        self.device = torch.device(device)
        self.scaler = (torch.amp.GradScaler("cuda")
                       if precision == "fp16" and self.device.type == "cuda" else None)

    @property
    def scales_loss(self) -> bool:
        """Whether the loss is scaled (fp16 on CUDA)."""
        return self.scaler is not None

    def autocast(self) -> contextlib.AbstractContextManager:
        return _autocast(self.name, self.device)

    def backward(self, loss: Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring ``optimizer``'s gradients to their true scale (before clipping)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, skipped by the scaler when the scaled gradients overflowed."""
        if self.scaler is not None:
            self.scaler.step(optimizer)
        else:
            optimizer.step()

    def update(self) -> None:
        """Once per optimizer step, after every optimizer stepped: adjust the loss scale."""
        if self.scaler is not None:
            self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return {"precision": self.name,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the scaler's state; a state without one (or ``None``) leaves it as it is."""
        if self.scaler is not None and state and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
