"""A small LSTM encoder-decoder with dot-product attention over the encoder states.

Incremental decoding keeps the decoder LSTM's ``(h, c)`` between steps; the
encoder's final state starts it (the source cache).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..problems.algorithmic import AlgorithmicHParams
from ..problems.base import PAD_ID
from ..registry import hparams_sets, models
from .encoder_decoder import DecodeState, EncoderDecoder, Seq2SeqHParams
from .lstm_cells import nn_lstm

__all__ = ["LSTMSeq2Seq", "LSTMAttentionBody", "lstm_seq2seq_multi30k"]

LSTMState = tuple[Tensor, Tensor]  # (h, c), each [L, B, H]


class LSTMAttentionBody(nn.Module):
    """(src [B, S, H], tgt [B, T, H], src_pad [B, S]) -> [B, T, H]."""

    def __init__(self, hp: HParams) -> None:
        super().__init__()
        h = hp.hidden_size
        self.encoder = nn.LSTM(h, h, hp.num_layers, batch_first=True, dropout=hp.dropout if hp.num_layers > 1 else 0.0)
        self.decoder = nn.LSTM(h, h, hp.num_layers, batch_first=True, dropout=hp.dropout if hp.num_layers > 1 else 0.0)
        self.combine = nn.Linear(2 * h, h)

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor) -> Tensor:
        memory, state = nn_lstm(self.encoder, src)          # [B, S, H]
        return self.decode(tgt, memory, src_pad, state)[0]

    def decode(self, tgt: Tensor, memory: Tensor, src_pad: Tensor, state: LSTMState
               ) -> tuple[Tensor, LSTMState]:
        """Decoder LSTM from ``state`` over tgt [B, T, H], attending to memory [B, S, H] -> [B, T, H]."""
        out, state = nn_lstm(self.decoder, tgt, state)      # [B, T, H]
        scores = out @ memory.transpose(1, 2)               # [B, T, S]
        scores = scores.masked_fill(src_pad[:, None, :], float("-inf"))
        context = torch.softmax(scores, dim=-1) @ memory    # [B, T, H]
        return torch.tanh(self.combine(torch.cat([out, context], dim=-1))), state


@models.register("lstm_seq2seq")
class LSTMSeq2Seq(EncoderDecoder):
    def make_body(self, hp: HParams) -> nn.Module:
        return LSTMAttentionBody(hp)

    def encode(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        return self.encode_for_decoding(inputs)[:2]

    def encode_for_decoding(self, inputs: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """The source cache is the encoder's final (h, c), each stored batch-first [B, L, H]."""
        memory, (h, c) = nn_lstm(self.body.encoder, self.src_bottom(inputs))   # [B, S, H], [L, B, H]
        return memory, inputs == PAD_ID, (h.transpose(0, 1), c.transpose(0, 1))

    def empty_cache(self, state: DecodeState) -> tuple[Tensor, ...]:
        return state.source_cache

    @staticmethod
    def _time_major(pair: tuple[Tensor, ...]) -> LSTMState:
        return pair[0].transpose(0, 1).contiguous(), pair[1].transpose(0, 1).contiguous()

    def cached_step(self, tokens: Tensor, state: DecodeState) -> tuple[Tensor, tuple[Tensor, ...]]:
        x = self.tgt_bottom.embed_step(tokens, state.steps)[:, None]   # [N, 1, H]
        out, (h, c) = self.body.decode(x, state.memory, state.src_pad, self._time_major(state.cache))
        return out[:, 0], (h.transpose(0, 1), c.transpose(0, 1))         # [N, H]; [N, L, H] each

    def decode_body(self, tgt: Tensor, state: DecodeState) -> Tensor:
        return self.body.decode(tgt, state.memory, state.src_pad, self._time_major(state.source_cache))[0]


@hparams_sets.register("lstm_seq2seq_algorithmic")
def lstm_seq2seq_algorithmic() -> AlgorithmicHParams:
    return AlgorithmicHParams(hidden_size=64, num_layers=1, batch_size=64, learning_rate=3e-3,
                              optimizer="adam", lr_schedule="cosine", warmup_steps=50,
                              max_grad_norm=1.0, max_steps=1000)


@hparams_sets.register("lstm_seq2seq_multi30k")
def lstm_seq2seq_multi30k() -> Seq2SeqHParams:
    """A 2x256 attention LSTM for Multi30k on CPU: shared + tied embeddings over the shared
    8k BPE vocabulary, dropout 0.2, label smoothing 0.1, Adam 1e-3 with warmup then 1/sqrt(step),
    4096-token batches."""
    return Seq2SeqHParams(hidden_size=256, num_layers=2, dropout=0.2, label_smoothing=0.1,
                          tie_embeddings=True, shared_embeddings=True, batch_tokens=4096,
                          optimizer="adam", learning_rate=1e-3, adam_beta2=0.98, lr_schedule="rsqrt_decay",
                          warmup_steps=1000, max_grad_norm=1.0, max_epochs=20)
