"""Checkpoint components for the objects whose own ``state_dict`` is not the whole story.

Every component of a checkpoint has ``state_dict()`` (tensors and plain data) and
``load_state_dict(state)``. The schedule, the callbacks, the :class:`Precision`, the
feeder and the :class:`TrainState` are components as they are; this module adds:

- :class:`ModelState`: the model's parameters and buffers (an FSDP-sharded model's gathered
  to the main rank, :mod:`hotloop.parallel.fsdp_state`); a checkpoint that does not fit says
  so in one line (:class:`StateMismatch`).
- :class:`OptimizerState`: the optimizer state gathered across ranks (the context's
  ``consolidate_optimizer_state``, a collective; loading through its ``load_optimizer_state``
  when it has one); loading keeps this run's kernel choice (``foreach``/``fused``,
  ``strategy.fused_optimizer``).
- :class:`GlobalRNG`: the Python, numpy and torch (and CUDA, on a CUDA run) generators.
"""
from __future__ import annotations

import random
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from .checkpoint import decode_plain, encode_plain

__all__ = ["Stateful", "StateMismatch", "ModelState", "OptimizerState", "GlobalRNG", "seed_everything"]

_GROUP_EXECUTION_KEYS = ("foreach", "fused", "capturable", "differentiable")


class Stateful(Protocol):
    """A checkpoint component: its state as tensors and plain data, and back."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class StateMismatch(ValueError):
    """A saved state that does not fit this run's component; the message says how."""


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class ModelState:
    """``model``'s ``state_dict``; loading one that does not fit raises :class:`StateMismatch`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def _sharded(self) -> bool:
        return any(hasattr(p, "full_tensor") for p in self.model.parameters())   # DTensors: FSDP

    def state_dict(self) -> dict[str, Any]:
        if self._sharded():
            from ..parallel.fsdp_state import full_model_state
            return full_model_state(self.model)
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            if self._sharded():
                from ..parallel.fsdp_state import load_full_model_state
                load_full_model_state(self.model, state)
            else:
                self.model.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as exc:
            first = str(exc).strip().splitlines()
            detail = " ".join(line.strip() for line in first[:3])[:300]
            raise StateMismatch(f"does not fit this model: {detail}") from None


class OptimizerState:
    """The full optimizer state (``dist`` gathers a sharded one: every rank must call)."""

    def __init__(self, optimizer: Any, dist: Any) -> None:
        self.optimizer, self.dist = optimizer, dist

    def state_dict(self) -> dict[str, Any]:
        return self.dist.consolidate_optimizer_state(self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = self.optimizer.param_groups
        execution = [{k: g[k] for k in _GROUP_EXECUTION_KEYS if k in g} for g in groups]
        load = getattr(self.dist, "load_optimizer_state", None)
        try:
            if load is not None:
                load(self.optimizer, state)
            else:
                self.optimizer.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise StateMismatch(f"has optimizer state that does not fit: {exc}") from None
        for group, keys in zip(self.optimizer.param_groups, execution):
            group.update(keys)  # keep this run's kernel choice (strategy.fused_optimizer)


class GlobalRNG:
    """The process's global random generators; CUDA's too when ``device`` is a CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _cuda(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_available()

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = random.getstate()
        state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state(),
                                 "numpy": encode_plain(list(np.random.get_state()))}
        if self._cuda():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        np.random.set_state(tuple(decode_plain(state["numpy"])))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and self._cuda():
            torch.cuda.set_rng_state_all(state["cuda"])
