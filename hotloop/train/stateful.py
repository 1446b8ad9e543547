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

__all__ = ["Stateful", "StateMismatch", "ModelState", "OptimizerState", "GlobalRNG", "seed_everything",
           "regroup_single_group"]

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


def regroup_single_group(state: dict[str, Any], groups: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    """A one-group optimizer state (parameters numbered in ``order``, the model's trainable
    parameters) renumbered for ``groups``, which name their parameters (``param_names``).

    Checkpoints written before the optimizer had parameter groups (no weight decay on biases and
    norms, layer-wise LR scales) resume this way: each parameter keeps its own moments; each group
    keeps the saved hyperparameters except its own ``weight_decay`` and ``lr_scale``.
    """
    saved = state["param_groups"][0]
    index = {name: i for i, name in enumerate(order)}
    new_groups, new_state, j = [], {}, 0
    for group in groups:
        ids = []
        for name in group["param_names"]:
            old = index[name]
            if old in state["state"]:
                new_state[j] = state["state"][old]
            ids.append(j)
            j += 1
        own = {k: group[k] for k in ("weight_decay", "lr_scale", "param_names") if k in group}
        new_groups.append({**{k: v for k, v in saved.items() if k != "params"}, **own, "params": ids})
    return {"state": new_state, "param_groups": new_groups}


class OptimizerState:
    """The full optimizer state (``dist`` gathers a sharded one: every rank must call).

    ``model``: lets a one-group state saved before parameter groups existed load into grouped ones.
    """

    def __init__(self, optimizer: Any, dist: Any, model: nn.Module | None = None) -> None:
        self.optimizer, self.dist, self.model = optimizer, dist, model

    def state_dict(self) -> dict[str, Any]:
        return self.dist.consolidate_optimizer_state(self.optimizer)

    def _single_group_fits(self, state: dict[str, Any]) -> bool:
        groups = self.optimizer.param_groups
        saved = state.get("param_groups") if isinstance(state, dict) else None
        return (self.model is not None and isinstance(saved, list) and len(saved) == 1 and len(groups) > 1
                and all("param_names" in g for g in groups)
                and len(saved[0].get("params", ())) == sum(len(g["params"]) for g in groups))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = self.optimizer.param_groups
        execution = [{k: g[k] for k in _GROUP_EXECUTION_KEYS if k in g} for g in groups]
        if self._single_group_fits(state):
            order = [n for n, p in self.model.named_parameters() if p.requires_grad]
            if set(order) == {n for g in groups for n in g["param_names"]}:
                state = regroup_single_group(state, groups, order)
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
