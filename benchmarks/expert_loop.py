"""The two hand-written contenders of the speed tables: the naive loop and the expert loop.

- :class:`PlainLoop` (``plain``, "naive"): the loop users write first: eager fp32,
  ``optimizer.zero_grad()``, the hparams' clipping, a per-tensor optimizer update and
  ``loss.item()`` every step.
- :class:`ExpertLoop` (``expert``): the same loop plus what a competent PyTorch user
  adds (:func:`expert_settings`): bf16 autocast only where the hardware has fast bf16
  (:attr:`hotloop.tools.hardware.HardwareInfo.fast_bf16`, which honours the
  ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY`` caps), a fused optimizer where torch
  has one for the optimizer and device (else ``foreach``), foreach clipping,
  ``channels_last`` for models with ``Conv2d`` (model and 4-D float inputs),
  ``zero_grad(set_to_none=True)`` and the loss read once per block (:meth:`ExpertLoop.flush`),
  not every step; on an accelerator, batches read by :data:`ACCELERATOR_DATA_WORKERS` worker
  processes and copied through pinned memory (``DataLoader(num_workers=4, pin_memory=True)``);
  optionally ``torch.compile`` of the loss (``expert_compiled``).

Both build their optimizer over the hparams' parameter groups (no weight decay on biases and norm
weights for AdamW, layer-wise LR decay), as hotloop does, so all three contenders run the same math.
Both take the batches from a ``next_batch()`` callable, so ``benchmarks/zoo.py`` and the
tests feed them alike. A phased model (``parameter_groups()`` + ``<phase>_loss``, CycleGAN)
steps each phase's optimizer in turn, as the plain loop does; the first phase's loss is
the one recorded.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn

from hotloop.hparams import HParams
from hotloop.optim import build_optimizer, fused_kernel_available, sparse_gradient_modules
from hotloop.param_groups import param_groups
from hotloop.tools.hardware import HardwareInfo, detect_hardware

__all__ = ["ExpertSettings", "PlainLoop", "ExpertLoop", "expert_settings", "expert_precision",
           "plain_settings", "PRECISIONS", "ACCELERATOR_DATA_WORKERS"]

Batch = dict[str, torch.Tensor]
PRECISIONS = ("auto", "fp32")   # the --precision modes: "auto" = bf16 where fast, "fp32" = never bf16
#: the expert's reader worker processes on an accelerator (on a CPU they would take the step's cores)
ACCELERATOR_DATA_WORKERS = 4


def expert_precision(device: torch.device | str, mode: str = "auto",
                     hardware: HardwareInfo | None = None) -> str:
    """``"bf16"`` where ``mode`` is ``auto`` and the hardware has fast bf16, else ``"fp32"``."""
    if mode not in PRECISIONS:
        raise ValueError(f"precision mode {mode!r}; choose one of {list(PRECISIONS)}")
    hw = hardware or detect_hardware(device)
    return "bf16" if mode == "auto" and hw.fast_bf16 else "fp32"


def _phase_groups(model: nn.Module) -> dict[str, list[nn.Parameter]] | None:
    """``{phase: parameters}`` of a phased model (``parameter_groups()``), None for a one-loss model."""
    groups = getattr(model, "parameter_groups", None)
    if not callable(groups):
        return None
    return {name: [p for p in params if p.requires_grad] for name, params in groups().items()}


@dataclass(frozen=True)
class ExpertSettings:
    """What the expert loop does beyond the plain one (``to_dict`` goes into the JSON)."""

    precision: str = "fp32"         # "bf16": autocast of the forward (the loss); "fp32": none
    optimizer: str = "fused"        # "fused" (where torch has it, else foreach) | "foreach" | "per-tensor"
    channels_last: bool = False     # model and 4-D float inputs in channels_last
    set_to_none: bool = True        # zero_grad(set_to_none=True)
    clip_foreach: bool = True       # clip_grad_norm_(foreach=True)
    loss_read: str = "once per block"
    compile: bool = False           # torch.compile of the loss function (inductor)
    data_workers: int = 0           # reader worker processes (the feed the caller builds honours it)
    pin_memory: bool = False        # host-to-device copies through pinned memory, asynchronous

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plain_settings() -> dict[str, Any]:
    """The plain loop's settings, in :class:`ExpertSettings`' terms."""
    return {"precision": "fp32", "optimizer": "per-tensor", "channels_last": False, "set_to_none": True,
            "clip_foreach": False, "loss_read": "every step (loss.item())", "compile": False,
            "data_workers": 0, "pin_memory": False}


def expert_settings(model: nn.Module, device: torch.device | str, precision: str = "auto", *,
                    compile: bool = False, hardware: HardwareInfo | None = None) -> ExpertSettings:
    """The expert's choices for ``model`` on ``device`` (``precision``: a :data:`PRECISIONS` mode)."""
    sparse = bool(sparse_gradient_modules(model))
    accelerator = torch.device(device).type != "cpu"
    return ExpertSettings(precision=expert_precision(device, precision, hardware),
                          optimizer="per-tensor" if sparse else "fused",
                          channels_last=any(isinstance(m, nn.Conv2d) for m in model.modules()),
                          compile=compile, data_workers=ACCELERATOR_DATA_WORKERS if accelerator else 0,
                          pin_memory=accelerator)


def _optimizer_params(model: nn.Module, hp: HParams, phase: str, params: list[nn.Parameter]) -> list[Any]:
    """What a one-loss model's optimizer is built over: the hparams' groups (no weight decay on
    biases and norms for AdamW, layer-wise LR decay), as hotloop builds them; a phase's parameters."""
    return param_groups(model, hp) if phase == "all" else params


def _expert_optimizer(params: list[Any], hp: HParams, mode: str) -> torch.optim.Optimizer:
    """The hparams' optimizer with a fused kernel (``mode="fused"``, where torch has one for it and
    the parameters' device; else foreach), foreach, or the per-tensor loop."""
    optimizer = build_optimizer(params, hp, fused=mode != "per-tensor")     # CUDA: fused, else foreach
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    if mode == "fused" and fused_kernel_available(type(optimizer), tensors):
        for group in optimizer.param_groups:      # before the first step: no state to convert
            group["foreach"], group["fused"] = False, True
    elif mode == "foreach":
        for group in optimizer.param_groups:
            group["foreach"] = True
            if group.get("fused"):
                group["fused"] = False
    return optimizer


def _optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    group = optimizer.param_groups[0]
    return "fused" if group.get("fused") else "foreach" if group.get("foreach") else "per-tensor"


class PlainLoop:
    """The user's loop: zero_grad, backward, the hparams' clipping, a per-tensor step,
    ``loss.item()`` each step (a phased model: each phase in turn, with its own optimizer)."""

    def __init__(self, model: nn.Module, hp: HParams, next_batch: Callable[[], Batch]) -> None:
        self.model, self.next_batch = model.train(), next_batch
        groups = _phase_groups(model)
        self.phased = groups is not None
        groups = groups or {"all": list(model.parameters())}
        self.optimizers = {name: build_optimizer(_optimizer_params(model, hp, name, params), hp, fused=False)
                           for name, params in groups.items()}
        self.max_grad_norm = hp.max_grad_norm
        self.losses: list[float] = []

    def step(self) -> None:
        batch = self.next_batch()
        if not self.phased:
            opt = self.optimizers["all"]
            opt.zero_grad()
            loss = self.model.loss(batch).loss
            loss.backward()
            if self.max_grad_norm > 0:                  # the hparams' clipping, as users write it
                nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            opt.step()
            self.losses.append(loss.item())
            return
        for name, opt in self.optimizers.items():
            self.model.zero_grad(set_to_none=True)
            loss = getattr(self.model, f"{name}_loss")(batch).loss
            loss.backward()
            if self.max_grad_norm > 0:
                nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]],
                                         self.max_grad_norm)
            opt.step()
            if name == next(iter(self.optimizers)):
                self.losses.append(loss.item())

    def flush(self) -> None:
        """Nothing pending: every step read its loss."""


class ExpertLoop:
    """The plain loop with the expert's lines (:class:`ExpertSettings`); losses are kept on the
    device and read by :meth:`flush` (the zoo calls it at the end of every timed block).

    ``compile_seconds``: wall time of the first step when ``settings.compile`` (compilation
    included); recompilations for new shapes later fall into the steps that meet them.
    """

    def __init__(self, model: nn.Module, hp: HParams, next_batch: Callable[[], Batch],
                 device: torch.device | str, settings: ExpertSettings) -> None:
        self.device, self.settings, self.next_batch = torch.device(device), settings, next_batch
        if settings.channels_last:
            model.to(memory_format=torch.channels_last)    # before the optimizers: parameters keep identity
        self.model = model.train()
        groups = _phase_groups(model)
        self.phased = groups is not None
        groups = groups or {"all": [p for p in model.parameters() if p.requires_grad]}
        self.params = groups
        self.optimizers = {name: _expert_optimizer(_optimizer_params(model, hp, name, params), hp, settings.optimizer)
                           for name, params in groups.items()}
        self.max_grad_norm = hp.max_grad_norm
        self.autocast_dtype = torch.bfloat16 if settings.precision == "bf16" else None
        self.loss_fns: dict[str, Callable[[Batch], torch.Tensor]] = {
            name: self._loss_fn(None if name == "all" else f"{name}_loss") for name in groups}
        self.pending: list[torch.Tensor] = []
        self.losses: list[float] = []
        self.compile_seconds = 0.0
        self.steps = 0

    def _loss_fn(self, method: str | None) -> Callable[[Batch], torch.Tensor]:
        """The forward of one phase (``model.loss`` or ``model.<method>``) under the precision,
        compiled when the settings say so."""
        dtype, device_type = self.autocast_dtype, self.device.type
        fn = self.model.loss if method is None else getattr(self.model, method)

        def loss(batch: Batch) -> torch.Tensor:
            with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                return fn(batch).loss
        return torch.compile(loss) if self.settings.compile else loss

    @property
    def optimizer_kinds(self) -> dict[str, str]:
        """``{phase: "fused" | "foreach" | "per-tensor"}``: what each optimizer actually runs."""
        return {name: _optimizer_kind(opt) for name, opt in self.optimizers.items()}

    def _batch(self) -> Batch:
        batch = self.next_batch()
        if not self.settings.channels_last:
            return batch
        return {k: v.contiguous(memory_format=torch.channels_last)
                if isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point() else v
                for k, v in batch.items()}

    def step(self) -> None:
        started = time.perf_counter()
        batch = self._batch()
        for i, (name, opt) in enumerate(self.optimizers.items()):
            if self.phased:
                self.model.zero_grad(set_to_none=self.settings.set_to_none)
            else:
                opt.zero_grad(set_to_none=self.settings.set_to_none)
            loss = self.loss_fns[name](batch)
            loss.backward()
            if self.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(self.params[name], self.max_grad_norm,
                                         foreach=self.settings.clip_foreach or None)
            opt.step()
            if i == 0:
                self.pending.append(loss.detach())
        if self.steps == 0 and self.settings.compile:
            self.compile_seconds = time.perf_counter() - started
        self.steps += 1

    def flush(self) -> None:
        """Read the pending losses back (one host sync for the whole block)."""
        if self.pending:
            self.losses += [float(x) for x in torch.stack(self.pending).float().tolist()]
            self.pending.clear()
