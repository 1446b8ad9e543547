"""Transformer encoder-decoder (Vaswani et al.) for seq2seq problems."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..problems.algorithmic import AlgorithmicHParams
from ..problems.base import PAD_ID, Batch, ProblemSpec
from ..registry import hparams_sets, models
from .base import SequenceModel
from .layers import OutputTop, TokenEmbedding, shift_right

__all__ = ["Transformer", "TransformerBody"]


class TransformerBody(nn.Module):
    """(src [B, S, H], tgt [B, T, H], src_pad [B, S]) -> [B, T, H]."""

    def __init__(self, hp: HParams) -> None:
        super().__init__()
        self.net = nn.Transformer(
            d_model=hp.hidden_size, nhead=hp.num_heads, num_encoder_layers=hp.num_layers,
            num_decoder_layers=hp.num_layers, dim_feedforward=hp.filter_size,
            dropout=hp.dropout, batch_first=True, norm_first=True)

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor) -> Tensor:
        t = tgt.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf"), device=tgt.device), diagonal=1)
        return self.net(src, tgt, tgt_mask=causal, src_key_padding_mask=src_pad,
                        memory_key_padding_mask=src_pad, tgt_is_causal=True)


@models.register("transformer")
class Transformer(SequenceModel):
    tasks = ("seq2seq",)

    def __init__(self, hp: HParams, spec: ProblemSpec, body: nn.Module | None = None) -> None:
        super().__init__(hp, spec)
        max_len = max(spec.max_input_length, spec.max_target_length, 1)
        self.src_bottom = TokenEmbedding(spec.input_vocab_size, hp.hidden_size, max_len, hp.dropout)
        self.tgt_bottom = TokenEmbedding(spec.target_vocab_size, hp.hidden_size, max_len, hp.dropout)
        self.body = body if body is not None else TransformerBody(hp)
        self.top = OutputTop(hp.hidden_size, spec.target_vocab_size)

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        inputs, targets = batch["inputs"], batch["targets"]
        src = self.src_bottom(inputs)                     # [B, S, H]
        tgt = self.tgt_bottom(shift_right(targets))       # [B, T, H]
        return self.top(self.body(src, tgt, inputs == PAD_ID)), None


@hparams_sets.register("transformer_algorithmic")
def transformer_algorithmic() -> AlgorithmicHParams:
    """Small enough to solve reverse/copy on 2 CPU cores in about a minute."""
    return AlgorithmicHParams(hidden_size=64, num_layers=2, num_heads=4, filter_size=128,
                              dropout=0.0, batch_size=64, learning_rate=3e-3, optimizer="adam",
                              lr_schedule="cosine", warmup_steps=100, max_grad_norm=1.0,
                              max_steps=2000)
