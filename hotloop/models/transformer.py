"""Transformer encoder-decoder (Vaswani et al.) for seq2seq problems."""
from __future__ import annotations


import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..problems.algorithmic import AlgorithmicHParams
from ..registry import hparams_sets, models
from .encoder_decoder import EncoderDecoder

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
class Transformer(EncoderDecoder):
    learned_positions = True

    def make_body(self, hp: HParams) -> nn.Module:
        return TransformerBody(hp)


@hparams_sets.register("transformer_algorithmic")
def transformer_algorithmic() -> AlgorithmicHParams:
    """Small enough to solve reverse/copy on 2 CPU cores in about a minute."""
    return AlgorithmicHParams(hidden_size=64, num_layers=2, num_heads=4, filter_size=128,
                              dropout=0.0, batch_size=64, learning_rate=3e-3, optimizer="adam",
                              lr_schedule="cosine", warmup_steps=100, max_grad_norm=1.0,
                              max_steps=2000)
