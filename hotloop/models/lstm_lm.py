"""LSTM language model (Zaremba, Sutskever & Vinyals 2014) for streamed LM problems.

embedding -> dropout -> stacked LSTM (dropout between layers) -> dropout -> softmax.
The LSTM formulation (``lstm_impl``) and the output + loss formulation
(``fused_ce``) are interchangeable: same parameters, same function.

Loss: with ``loss_sum_over_time`` (Zaremba) the backpropagated loss is the
summed NLL divided by the batch size (mean over the batch, summed over time);
otherwise the mean over tokens (the PyTorch word_language_model example).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..ops.dropout import check_dropout_masks
from ..ops.dropout import dropout as apply_dropout
from ..problems.base import Batch, ProblemSpec
from ..registry import hparams_sets, models
from .base import LossOutput, SequenceModel, count, token_stats
from .fused_ce import linear_cross_entropy
from .lstm_cells import LSTM_IMPLS, LSTMImplError, LSTMState, run_lstm

__all__ = ["LSTMLM", "LSTMLMHParams", "FASTEST", "FASTEST_WIDE", "lstm_lm_small", "lstm_lm_medium", "lstm_lm_large",
           "lstm_lm_example"]


@dataclass(frozen=True)
class LSTMLMHParams(HParams):
    """Zaremba-style LSTM LM fields on top of :class:`HParams`."""

    lstm_impl: str = "fused"          # "fused" | "unrolled" | "hoisted" | "bptt" (same math)
    lstm_gemm_dtype: str = "fp32"     # "fp32" | "bf16": GEMM operand dtype of lstm_impl=bptt
    fused_ce: bool = True             # chunked output projection + cross-entropy
    ce_chunk_rows: int = 0            # rows of logits live at once in fused_ce (0: its default)
    ce_gemm_dtype: str = "fp32"       # "fp32" | "bf16": operand dtype of the fused_ce GEMMs
    loss_sum_over_time: bool = True   # loss = NLL summed over time, mean over batch
    tie_embeddings: bool = False
    dropout_masks: str = "bernoulli"  # "bernoulli" (F.dropout) | "bits16" (hotloop.ops.dropout)


_GEMM_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


@models.register("lstm_lm")
class LSTMLM(SequenceModel):
    """Word-level LSTM LM; carries ``(h, c)`` each ``[L, B, H]`` across batches."""

    tasks = ("lm",)
    hparams_class = LSTMLMHParams
    hp: LSTMLMHParams

    def __init__(self, hp: LSTMLMHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        impl = hp.lstm_impl
        if impl not in LSTM_IMPLS:
            raise LSTMImplError(f"unknown lstm_impl {impl!r}; choose one of {sorted(LSTM_IMPLS)}")
        for field, value in (("ce_gemm_dtype", hp.ce_gemm_dtype), ("lstm_gemm_dtype", hp.lstm_gemm_dtype)):
            if value not in _GEMM_DTYPES:
                raise ValueError(f"unknown {field} {value!r}; choose one of {list(_GEMM_DTYPES)}")
        check_dropout_masks(hp.dropout_masks, "dropout_masks")
        if hp.lstm_gemm_dtype != "fp32" and impl != "bptt":
            raise ValueError(f"lstm_gemm_dtype={hp.lstm_gemm_dtype} needs lstm_impl=bptt (got lstm_impl={impl}); "
                             f"for nn.LSTM use the strategy's precision=bf16 instead")
        vocab, hidden = spec.target_vocab_size, hp.hidden_size
        self.embedding = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, hp.num_layers,
                           dropout=hp.dropout if hp.num_layers > 1 else 0.0)
        self.output = nn.Linear(hidden, vocab)
        if hp.tie_embeddings:
            self.output.weight = self.embedding.weight
        self.init_weights()

    # -- state ---------------------------------------------------------------
    def initial_state(self, batch_size: int, device: torch.device) -> LSTMState:
        shape = (self.hp.num_layers, batch_size, self.hp.hidden_size)
        return (torch.zeros(shape, device=device), torch.zeros(shape, device=device))

    def _state_or_zeros(self, state: Any, batch_size: int, device: torch.device) -> LSTMState:
        if state is None:
            return self.initial_state(batch_size, device)
        h, c = state
        expected = (self.hp.num_layers, batch_size, self.hp.hidden_size)
        if tuple(h.shape) != expected or tuple(c.shape) != expected:
            raise ValueError(f"lstm_lm state must be (h, c) each {list(expected)}, "
                             f"got {list(h.shape)} and {list(c.shape)}")
        return h, c

    # -- body ----------------------------------------------------------------
    def hidden_states(self, inputs: Tensor, state: Any) -> tuple[Tensor, LSTMState]:
        """inputs [B, T] -> top-layer outputs [T, B, H] (after output dropout), new state."""
        batch = inputs.shape[0]
        state = self._state_or_zeros(state, batch, inputs.device)
        drop, masks = self.hp.dropout, self.hp.dropout_masks
        x = apply_dropout(self.embedding(inputs.t()), drop, self.training, masks)   # [T, B, H]
        y, new_state = run_lstm(self.hp.lstm_impl, self.rnn, x, state, dropout=drop, training=self.training,
                                gemm_dtype=self._gemm_dtype(self.hp.lstm_gemm_dtype), dropout_masks=masks)
        return apply_dropout(y, drop, self.training, masks), new_state              # [T, B, H]

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, LSTMState]:
        y, new_state = self.hidden_states(batch["inputs"], state)
        return self.output(y).transpose(0, 1), new_state                  # [B, T, V]

    # -- loss ----------------------------------------------------------------
    def _gemm_dtype(self, name: str) -> torch.dtype | None:
        """``name`` ("fp32" | "bf16") as GEMM operand dtype, only while training: evaluation stays fp32."""
        return _GEMM_DTYPES[name] if self.training else None

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        targets = batch["targets"]                                       # [B, T]
        if self.hp.fused_ce and not with_accuracy:
            y, new_state = self.hidden_states(batch["inputs"], state)    # [T, B, H]
            flat_targets = targets.t().reshape(-1)                       # [T*B], time-major
            nll = linear_cross_entropy(y.reshape(-1, y.shape[-1]), self.output.weight,
                                       self.output.bias, flat_targets,
                                       ignore_index=self.spec.pad_id,
                                       chunk_rows=self.hp.ce_chunk_rows or None,
                                       gemm_dtype=self._gemm_dtype(self.hp.ce_gemm_dtype))
            pad = self.spec.pad_id
            tokens = (flat_targets != pad).sum() if pad >= 0 else count(flat_targets.numel(), targets)
            stats = {"nll_sum": nll.detach(), "tokens": tokens, "examples": count(targets.shape[0], targets)}
            logits = None
        else:
            logits, new_state = self(batch, state)
            mean_nll, stats = token_stats(logits, targets, with_accuracy=with_accuracy,
                                          pad_id=self.spec.pad_id)
            nll = mean_nll * stats["tokens"].clamp(min=1)
        if self.hp.loss_sum_over_time:
            loss = nll / targets.shape[0]
        else:
            loss = nll / stats["tokens"].clamp(min=1)
        return LossOutput(loss, stats, new_state, logits)


# The fastest formulations measured on the 2-core AVX512-BF16 CPU (docs/results.md):
# the chunked fused output/cross-entropy with bf16 GEMM operands (fp32 softmax
# accumulation, loss and gradients) everywhere; for the LSTM, oneDNN's nn.LSTM at
# hidden 200 (per-step overhead dominates) and the hand-written BPTT with bf16 GEMM
# operands from hidden 650 up (the per-step GEMM is weight-bandwidth bound).
# Dropout masks from 16-bit draws (a quarter of bernoulli_'s generator calls) and the
# clip factor folded into the plain-SGD step (one pass less over every gradient).
# Use ce_gemm_dtype=fp32 (and lstm_gemm_dtype=fp32) for fp32 math.
FASTEST = {"lstm_impl": "fused", "fused_ce": True, "ce_gemm_dtype": "bf16", "dropout_masks": "bits16",
           "clip_via_lr": True}
FASTEST_WIDE = {**FASTEST, "lstm_impl": "bptt", "lstm_gemm_dtype": "bf16"}


def _zaremba(hidden: int, steps: int, init: float, max_epoch: int, max_max_epoch: int,
             decay: float, dropout: float, clip: float) -> LSTMLMHParams:
    return LSTMLMHParams(
        hidden_size=hidden, num_layers=2, max_length=steps, batch_size=20, init_scale=init,
        optimizer="sgd", learning_rate=1.0, lr_schedule="epoch_decay", lr_decay=decay,
        lr_decay_start_epoch=max_epoch, max_epochs=max_max_epoch, dropout=dropout,
        max_grad_norm=clip, weight_decay=0.0, loss_sum_over_time=True,
        **(FASTEST if hidden < 650 else FASTEST_WIDE))


@hparams_sets.register("lstm_lm_small")
def lstm_lm_small() -> LSTMLMHParams:
    """Zaremba et al. 2014 small: 2x200, 20 steps, non-regularised (paper test ppl 114.5)."""
    return _zaremba(200, 20, 0.1, 4, 13, 0.5, 0.0, 5.0)


@hparams_sets.register("lstm_lm_medium")
def lstm_lm_medium() -> LSTMLMHParams:
    """Zaremba et al. 2014 medium: 2x650, 35 steps, dropout 0.5 (paper test ppl 82.7)."""
    return _zaremba(650, 35, 0.05, 6, 39, 0.8, 0.5, 5.0)


@hparams_sets.register("lstm_lm_large")
def lstm_lm_large() -> LSTMLMHParams:
    """Zaremba et al. 2014 large: 2x1500, 35 steps, dropout 0.65 (paper test ppl 78.4)."""
    return _zaremba(1500, 35, 0.04, 14, 55, 1 / 1.15, 0.65, 10.0)


@hparams_sets.register("lstm_lm_example")
def lstm_lm_example() -> LSTMLMHParams:
    """PyTorch examples/word_language_model defaults: 2x200, bptt 35, lr 20 /4 on plateau."""
    return LSTMLMHParams(
        hidden_size=200, num_layers=2, max_length=35, batch_size=20, init_scale=0.1,
        optimizer="sgd", learning_rate=20.0, lr_schedule="plateau", lr_decay=0.25,
        max_epochs=40, dropout=0.2, max_grad_norm=0.25, loss_sum_over_time=False, **FASTEST)
