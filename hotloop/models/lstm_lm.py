"""LSTM language model (Zaremba, Sutskever & Vinyals 2014) for streamed LM problems.

embedding -> dropout -> stacked LSTM (dropout between layers) -> dropout -> softmax.
How the LSTM (``lstm_impl``, ``lstm_gemm_dtype``), the output + loss (``fused_ce``,
``ce_chunk_rows``, ``ce_gemm_dtype``) and the dropout masks (``dropout_masks``) are
computed is the Strategy's formulation (:mod:`hotloop.models.formulation`), not an
hparam: same parameters, same function, timed by ``--strategy auto``.

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
from ..ops.dropout import dropout as apply_dropout
from ..problems.base import Batch, ProblemSpec
from ..registry import hparams_sets, models
from .base import LossOutput, SequenceModel, fused_token_stats, token_stats
from .formulation import BITS16_OPTION, FORMULATION_FIELDS, FUSED_CE_OPTIONS, FormulationOption
from .lstm_cells import LSTMState, run_lstm

__all__ = ["LSTMLM", "LSTMLMHParams", "lstm_lm_small", "lstm_lm_medium", "lstm_lm_large", "lstm_lm_example",
           "WIDE_HIDDEN"]

#: hidden size from which the hand-written BPTT with bf16 GEMMs is worth timing: its per-step
#: GEMM is weight-bandwidth bound there, while at 200 nn.LSTM's per-step overhead dominates
#: (docs/results.md, the LSTM ladder)
WIDE_HIDDEN = 650


@dataclass(frozen=True)
class LSTMLMHParams(HParams):
    """Zaremba-style LSTM LM fields on top of :class:`HParams` (the math a paper reports)."""

    loss_sum_over_time: bool = True   # loss = NLL summed over time, mean over batch
    tie_embeddings: bool = False


_GEMM_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


@models.register("lstm_lm")
class LSTMLM(SequenceModel):
    """Word-level LSTM LM; carries ``(h, c)`` each ``[L, B, H]`` across batches."""

    tasks = ("lm",)
    hparams_class = LSTMLMHParams
    formulation_fields = FORMULATION_FIELDS
    hp: LSTMLMHParams

    def __init__(self, hp: LSTMLMHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        vocab, hidden = spec.target_vocab_size, hp.hidden_size
        self.embedding = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, hp.num_layers,
                           dropout=hp.dropout if hp.num_layers > 1 else 0.0)
        self.output = nn.Linear(hidden, vocab)
        if hp.tie_embeddings:
            self.output.weight = self.embedding.weight
        self.init_weights()

    def formulation_options(self) -> list[FormulationOption]:
        """The fused output+CE (fp32 or with bf16 GEMM operands) and, from WIDE_HIDDEN up,
        the hand-written BPTT with bf16 GEMM operands; with dropout, bits16 masks."""
        options = list(FUSED_CE_OPTIONS)
        if self.hp.hidden_size >= WIDE_HIDDEN:
            options.append(FormulationOption(
                "bptt bf16", {"lstm_impl": "bptt", "lstm_gemm_dtype": "bf16"},
                "hand-written BPTT LSTM with bf16 GEMM operands (fp32 gates and state)",
                rounding="bf16", needs_fast_bf16=True, expected_gain=0.3))
        if self.hp.dropout > 0:
            options.append(BITS16_OPTION)
        return options

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
        form = self.formulation
        drop, masks = self.hp.dropout, form.dropout_masks
        x = apply_dropout(self.embedding(inputs.t()), drop, self.training, masks)   # [T, B, H]
        y, new_state = run_lstm(form.lstm_impl, self.rnn, x, state, dropout=drop, training=self.training,
                                gemm_dtype=self._gemm_dtype(form.lstm_gemm_dtype), dropout_masks=masks)
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
        form = self.formulation
        if form.fused_ce and not with_accuracy:
            y, new_state = self.hidden_states(batch["inputs"], state)    # [T, B, H]
            flat_targets = targets.t().reshape(-1)                       # [T*B], time-major
            nll, stats = fused_token_stats(y.reshape(-1, y.shape[-1]), self.output.weight, self.output.bias,
                                           flat_targets, form, training=self.training,
                                           examples=targets.shape[0], pad_id=self.spec.pad_id)
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


def _zaremba(hidden: int, steps: int, init: float, max_epoch: int, max_max_epoch: int,
             decay: float, dropout: float, clip: float) -> LSTMLMHParams:
    return LSTMLMHParams(
        hidden_size=hidden, num_layers=2, max_length=steps, batch_size=20, init_scale=init,
        optimizer="sgd", learning_rate=1.0, lr_schedule="epoch_decay", lr_decay=decay,
        lr_decay_start_epoch=max_epoch, max_epochs=max_max_epoch, dropout=dropout,
        max_grad_norm=clip, weight_decay=0.0, loss_sum_over_time=True)


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
        max_epochs=40, dropout=0.2, max_grad_norm=0.25, loss_sum_over_time=False)
