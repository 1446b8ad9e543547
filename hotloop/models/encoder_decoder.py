"""The shared seq2seq shape: source and target embeddings -> body -> output top.

A concrete model names its body (``make_body``) and whether its embeddings
add learned positions; the body contract is
``(src [B, S, H], tgt [B, T, H], src_pad [B, S]) -> [B, T, H]``.
"""
from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from ..hparams import HParams
from ..problems.base import PAD_ID, Batch, ProblemSpec
from .base import SequenceModel
from .layers import OutputTop, TokenEmbedding, shift_right

__all__ = ["EncoderDecoder"]


class EncoderDecoder(SequenceModel):
    tasks = ("seq2seq",)
    learned_positions: ClassVar[bool] = False

    def __init__(self, hp: HParams, spec: ProblemSpec, body: nn.Module | None = None) -> None:
        super().__init__(hp, spec)
        max_len = max(spec.max_input_length, spec.max_target_length, 1) if self.learned_positions else 0
        self.src_bottom = TokenEmbedding(spec.input_vocab_size, hp.hidden_size, max_len, hp.dropout)
        self.tgt_bottom = TokenEmbedding(spec.target_vocab_size, hp.hidden_size, max_len, hp.dropout)
        self.body = body if body is not None else self.make_body(hp)
        self.top = OutputTop(hp.hidden_size, spec.target_vocab_size)

    def make_body(self, hp: HParams) -> nn.Module:
        raise NotImplementedError

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        inputs, targets = batch["inputs"], batch["targets"]
        src = self.src_bottom(inputs)                     # [B, S, H]
        tgt = self.tgt_bottom(shift_right(targets))       # [B, T, H]
        return self.top(self.body(src, tgt, inputs == PAD_ID)), None
