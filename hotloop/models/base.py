"""Model interface: embedding *bottom* -> tensor-to-tensor *body* -> output *top*.

Every model maps a batch (and an optional carried state) to logits and
implements :meth:`SequenceModel.loss`, which returns the scalar to
backpropagate plus *un-synchronised* statistics (tensors) that the trainer
sums and reads only every ``Strategy.sync_every`` steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError
from ..hparams import HParams
from .formulation import ENGINE_FIELDS, Formulation, FormulationError, FormulationOption
from .fused_ce import linear_token_loss
from ..problems.base import PAD_ID, Batch, ProblemSpec

__all__ = ["LossOutput", "SequenceModel", "token_stats", "fused_token_stats", "count", "ModelMismatchError"]


class ModelMismatchError(UserError, ValueError):
    """The model cannot serve this problem's task, or cannot read these hparams."""


@dataclass
class LossOutput:
    """``loss`` is what is backpropagated; ``stats`` are summable tensors.

    Standard stats: ``nll_sum`` (summed token NLL), ``tokens`` (non-pad target
    tokens), ``examples``; optional ``correct`` (tokens) and ``seq_correct``.
    """

    loss: Tensor
    stats: dict[str, Tensor]
    state: Any = None
    logits: Tensor | None = field(default=None, repr=False)
    weight: Tensor | None = None   # the count ``loss`` is a mean over (gradient accumulation weights by it)


def count(n: int, like: Tensor) -> Tensor:
    """A scalar int64 count on ``like``'s device, made by a fill kernel (no host-to-device copy)."""
    return like.new_full((), n, dtype=torch.int64)


def token_stats(logits: Tensor, targets: Tensor, *, with_accuracy: bool,
                label_smoothing: float = 0.0, pad_id: int = PAD_ID) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean token cross-entropy (``pad_id`` ignored; -1 = no padding) and summable stats.

    logits: [B, T, V]; targets: [B, T]. Returns (mean loss, stats).
    """
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    mask = flat_targets != pad_id
    tokens = mask.sum()
    ignore = pad_id if pad_id >= 0 else -100
    nll = F.cross_entropy(flat_logits.float(), flat_targets, ignore_index=ignore, reduction="sum")
    if label_smoothing > 0:
        loss = F.cross_entropy(flat_logits.float(), flat_targets, ignore_index=ignore,
                               label_smoothing=label_smoothing, reduction="sum")
    else:
        loss = nll
    denom = tokens.clamp(min=1)
    stats = {"nll_sum": nll.detach(), "tokens": tokens,
             "examples": count(targets.shape[0], targets)}
    if with_accuracy:
        hit = (logits.argmax(-1) == targets) | (targets == pad_id)  # [B, T]
        stats["correct"] = (hit.reshape(-1) & mask).sum()
        stats["seq_correct"] = hit.all(dim=-1).sum()
    return loss / denom, stats


def fused_token_stats(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                      formulation: Formulation, *, training: bool, examples: int, label_smoothing: float = 0.0,
                      pad_id: int = PAD_ID) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`token_stats` for the ``fused_ce`` formulation: the output projection and the loss
    chunk by chunk (``models/fused_ce.py``), no logits.

    hidden: [N, H], its rows aligned with targets: [N]; ``examples`` is the batch's example count.
    Returns (*summed* loss, label-smoothed while ``training``; stats ``nll_sum``, ``tokens``,
    ``examples``). GEMM operands are bf16 only while training with ``ce_gemm_dtype="bf16"``; the
    fp32 GEMMs are oneDNN's with ``linear_gemm="onednn"``.
    """
    gemm_dtype = torch.bfloat16 if formulation.ce_gemm_dtype == "bf16" and training else None
    loss_sum, nll_sum = linear_token_loss(hidden, weight, bias, targets,
                                          label_smoothing=label_smoothing if training else 0.0,
                                          ignore_index=pad_id, chunk_rows=formulation.ce_chunk_rows or None,
                                          gemm_dtype=gemm_dtype, linear_gemm=formulation.linear_gemm)
    tokens = (targets != pad_id).sum() if pad_id >= 0 else count(targets.numel(), targets)
    return loss_sum, {"nll_sum": nll_sum, "tokens": tokens, "examples": count(examples, targets)}


class SequenceModel(nn.Module):
    """Base for registered models.

    Subclasses set ``tasks`` (the problem tasks they serve), build
    ``bottom``/``body``/``top`` in ``__init__`` and implement ``forward``.
    Swapping the body means passing another ``nn.Module`` with the same
    ``[B, T, H] -> [B, T, H]`` contract.
    """

    tasks: ClassVar[tuple[str, ...]] = ("seq2seq",)
    #: the HParams class whose fields the model reads; others are refused with a clear error
    hparams_class: ClassVar[type[HParams]] = HParams
    #: the Strategy formulation fields the model reads (:mod:`hotloop.models.formulation`)
    formulation_fields: ClassVar[tuple[str, ...]] = ()
    #: name prefixes of the output head's parameters; the rest is the body (``freeze_body_steps``)
    head_prefixes: tuple[str, ...] = ()

    def __init__(self, hp: HParams, spec: ProblemSpec) -> None:
        super().__init__()
        if spec.task not in self.tasks:
            raise ModelMismatchError(
                f"model {type(self).__name__} serves tasks {list(self.tasks)}, "
                f"but the problem's task is {spec.task!r}")
        if not isinstance(hp, self.hparams_class):
            raise ModelMismatchError(
                f"model {type(self).__name__} reads {self.hparams_class.__name__} fields, but the hparams "
                f"are {type(hp).__name__}; pick an hparams set that returns {self.hparams_class.__name__}")
        self.hp = hp
        self.spec = spec
        self.formulation = Formulation()

    def use_formulation(self, formulation: Formulation) -> None:
        """Compute with ``formulation`` from now on (the step builder calls this with the
        Strategy's); fields outside ``formulation_fields`` must keep their plain values, except
        the ones the engine applies to any model (``ENGINE_FIELDS``: ``dropout_masks``)."""
        foreign = sorted(set(formulation.check().changed()) - set(self.formulation_fields) - set(ENGINE_FIELDS))
        if foreign:
            raise FormulationError(f"{type(self).__name__} does not read formulation field(s) {foreign}")
        self.formulation = formulation

    def formulation_options(self) -> list[FormulationOption]:
        """Alternative formulations worth timing for these hparams (none by default)."""
        return []

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        """Return ``(logits [B, T, V], new_state)``."""
        raise NotImplementedError

    def initial_state(self, batch_size: int, device: torch.device) -> Any:
        """Carried state for streamed problems (None for stateless models)."""
        return None

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        logits, new_state = self(batch, state)
        loss, stats = token_stats(logits, batch["targets"], with_accuracy=with_accuracy,
                                  label_smoothing=self.hp.label_smoothing if self.training else 0.0,
                                  pad_id=self.spec.pad_id)
        return LossOutput(loss, stats, new_state, logits, weight=stats["tokens"])

    def init_weights(self) -> None:
        """Uniform(-init_scale, init_scale) init when ``hp.init_scale > 0``."""
        if self.hp.init_scale > 0:
            for p in self.parameters():
                nn.init.uniform_(p, -self.hp.init_scale, self.hp.init_scale)
