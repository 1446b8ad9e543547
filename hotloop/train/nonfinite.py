"""The non-finite loss policy, without a per-step host sync.

Every step, :meth:`NonFiniteGuard.observe` turns the step's loss (and grad norm)
into a device-side flag; the flag is summed into the log window and read with the
other statistics every ``sync_every`` steps. The guard also keeps, on the device,
the first step whose loss was not finite, which is read only when reporting one.

Policies:

- ``stop``: the read that finds a non-finite step raises :class:`NonFiniteLossError`
  naming the step (and the window of steps it was detected in).
- ``skip``: the optimizer update of a step whose gradients are not finite is
  discarded on the device (parameters and optimizer state are put back with
  ``torch.where``), and the step is counted (``nonfinite_steps`` in the log row).
  When every step is finite the selected values are the updated ones, so results
  are bitwise those of a run without the guard. Optimizer state created by the
  discarded update is reset to zeros (the initial state of Adam, SGD momentum...).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..engine.clipping import plain
from ..errors import UserError

__all__ = ["NonFiniteGuard", "NonFiniteLossError", "POLICIES"]

POLICIES = ("stop", "skip")


class NonFiniteLossError(UserError, FloatingPointError):
    """Training produced a non-finite loss or gradient under the ``stop`` policy."""


def _local(tensor: Tensor) -> Tensor:
    """This rank's part of a ``DTensor`` (an FSDP shard, a view written in place), else ``tensor``."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _held_state(optimizer: torch.optim.Optimizer) -> Any:
    """Where the optimizer keeps its per-parameter state (a ZeRO optimizer: its local optimizer)."""
    local = getattr(optimizer, "optim", None)
    return local.state if isinstance(local, torch.optim.Optimizer) else optimizer.state


class NonFiniteGuard:
    """Device-side non-finite detection for one Trainer; ``policy`` is ``stop`` or ``skip``."""

    def __init__(self, policy: str, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        if policy not in POLICIES:
            raise UserError(f"on_nonfinite {policy!r}: use one of {', '.join(POLICIES)}")
        self.policy = policy
        self.optimizer = optimizer
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)  # first bad step (local)
        self.skipped = 0                       # steps discarded so far (host, updated at reads)
        self._grads_bad: Tensor | None = None  # [] bool, any update of this step not finite (skip)
        self._pending: dict[int, tuple[Tensor, list[tuple[Tensor, Tensor]], dict[int, dict[str, Tensor]]]] = {}
        if policy == "skip":
            for opt in self._torch_optimizers(optimizer):
                opt.register_step_pre_hook(self._before_update)
                opt.register_step_post_hook(self._after_update)

    @staticmethod
    def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
        """The optimizer, or each phase's optimizer of a step program (``.optimizers``)."""
        inner = getattr(optimizer, "optimizers", None)
        found = list(inner.values()) if isinstance(inner, dict) else [optimizer]
        if not all(hasattr(o, "register_step_pre_hook") for o in found):
            raise UserError(f"on_nonfinite=skip needs torch.optim optimizers, got {type(optimizer).__name__}")
        return found

    # ------------------------------------------------------------ skip hooks
    @torch.no_grad()
    def _before_update(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        norms = torch._foreach_norm([p.grad for p in params])                   # one [] per tensor
        # [] bool; over FSDP's gradient shards the norms are DTensors and all ranks agree on it
        bad = plain(~torch.isfinite(torch.stack([n.float() for n in norms])).all())
        self._grads_bad = bad if self._grads_bad is None else self._grads_bad | bad
        saved = [(p, _local(p).detach().clone()) for p in params]
        held = _held_state(optimizer)
        state = {id(p): {k: _local(v).clone() for k, v in held.get(p, {}).items() if isinstance(v, Tensor)}
                 for p in params}
        self._pending[id(optimizer)] = (bad, saved, state)

    @torch.no_grad()
    def _after_update(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        pending = self._pending.pop(id(optimizer), None)
        if pending is None:
            return
        bad, saved, saved_state = pending
        held = _held_state(optimizer)
        for param, before in saved:
            _local(param).copy_(torch.where(bad, before, _local(param)))
            old_state = saved_state.get(id(param), {})
            for key, value in held.get(param, {}).items():
                if isinstance(value, Tensor):
                    value = _local(value)
                    old = old_state.get(key)
                    old = old if old is not None else torch.zeros_like(value)
                    value.copy_(torch.where(bad.to(value.device), old, value))

    # -------------------------------------------------------------- per step
    @torch.no_grad()
    def observe(self, step: int, loss: Tensor, grad_norm: Tensor | None) -> Tensor:
        """The ``[]`` bool flag "step ``step`` was not finite" (device; nothing is read)."""
        bad = ~torch.isfinite(loss.detach()).all()
        if grad_norm is not None:
            bad = bad | ~torch.isfinite(grad_norm.detach()).all()
        if self._grads_bad is not None:
            bad = bad | self._grads_bad.to(bad.device)
            self._grads_bad = None
        self.first_bad = torch.where(bad & (self.first_bad < 0), step, self.first_bad)
        return bad

    def mask(self, bad: Tensor, stats: dict[str, Tensor], loss: Tensor,
             grad_norm: Tensor | None) -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
        """Under ``skip``: zero a discarded step's statistics so log rows stay finite."""
        if self.policy != "skip":
            return stats, loss, grad_norm
        zero = {k: torch.where(bad, torch.zeros_like(v), v) for k, v in stats.items()}
        loss = torch.where(bad, torch.zeros_like(loss), loss)
        if grad_norm is not None:
            grad_norm = torch.where(bad, torch.zeros_like(grad_norm), grad_norm)
        return zero, loss, grad_norm

    # -------------------------------------------------------------- at reads
    def check(self, count: int, first_step: int, last_step: int) -> None:
        """Apply the policy to a log window that had ``count`` non-finite steps (host values)."""
        if count <= 0:
            return
        if self.policy == "skip":
            self.skipped += count
            return
        exact = int(self.first_bad.item())   # read only on this error path
        where = f"at step {exact}" if exact >= 0 else "on another rank"
        raise NonFiniteLossError(
            f"non-finite loss or gradient {where} (detected in steps {first_step}-{last_step}, "
            f"{count} non-finite step(s)); lower the learning rate, enable clipping (max_grad_norm), "
            f"or pass --on-nonfinite skip; the last checkpoint before it is intact")
