"""A small LSTM encoder-decoder with dot-product attention over the encoder states."""
from __future__ import annotations


import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..problems.algorithmic import AlgorithmicHParams
from ..registry import hparams_sets, models
from .encoder_decoder import EncoderDecoder

__all__ = ["LSTMSeq2Seq", "LSTMAttentionBody"]


class LSTMAttentionBody(nn.Module):
    """(src [B, S, H], tgt [B, T, H], src_pad [B, S]) -> [B, T, H]."""

    def __init__(self, hp: HParams) -> None:
        super().__init__()
        h = hp.hidden_size
        self.encoder = nn.LSTM(h, h, hp.num_layers, batch_first=True, dropout=hp.dropout if hp.num_layers > 1 else 0.0)
        self.decoder = nn.LSTM(h, h, hp.num_layers, batch_first=True, dropout=hp.dropout if hp.num_layers > 1 else 0.0)
        self.combine = nn.Linear(2 * h, h)

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor) -> Tensor:
        memory, state = self.encoder(src)                   # [B, S, H]
        out, _ = self.decoder(tgt, state)                   # [B, T, H]
        scores = out @ memory.transpose(1, 2)               # [B, T, S]
        scores = scores.masked_fill(src_pad[:, None, :], float("-inf"))
        context = torch.softmax(scores, dim=-1) @ memory    # [B, T, H]
        return torch.tanh(self.combine(torch.cat([out, context], dim=-1)))


@models.register("lstm_seq2seq")
class LSTMSeq2Seq(EncoderDecoder):
    def make_body(self, hp: HParams) -> nn.Module:
        return LSTMAttentionBody(hp)


@hparams_sets.register("lstm_seq2seq_algorithmic")
def lstm_seq2seq_algorithmic() -> AlgorithmicHParams:
    return AlgorithmicHParams(hidden_size=64, num_layers=1, batch_size=64, learning_rate=3e-3,
                              optimizer="adam", lr_schedule="cosine", warmup_steps=50,
                              max_grad_norm=1.0, max_steps=1000)
