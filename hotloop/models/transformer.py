"""Transformer encoder-decoder (Vaswani et al.) for seq2seq problems, with incremental decoding.

The body is one ``nn.Transformer`` (pre-norm layers). Incremental decoding
(:meth:`Transformer.cached_step`) runs the same decoder-layer parameters one
token at a time: each layer keeps the keys and values of the tokens fed so far
(self-attention) and of the encoder output (cross-attention, computed once).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hparams import HParams
from ..problems.algorithmic import AlgorithmicHParams
from ..problems.base import PAD_ID
from ..registry import hparams_sets, models
from .encoder_decoder import DecodeState, EncoderDecoder, Seq2SeqHParams

__all__ = ["Transformer", "TransformerBody", "causal_mask", "transformer_base", "transformer_base_small"]


def causal_mask(length: int, like: Tensor) -> Tensor:
    """Additive [T, T] mask: 0 on and below the diagonal, -inf above (dtype/device of ``like``)."""
    return torch.triu(torch.full((length, length), float("-inf"), dtype=like.dtype, device=like.device),
                      diagonal=1)


class TransformerBody(nn.Module):
    """(src [B, S, H], tgt [B, T, H], src_pad [B, S]) -> [B, T, H]."""

    def __init__(self, hp: HParams) -> None:
        super().__init__()
        self.net = nn.Transformer(
            d_model=hp.hidden_size, nhead=hp.num_heads, num_encoder_layers=hp.num_layers,
            num_decoder_layers=hp.num_layers, dim_feedforward=hp.filter_size,
            dropout=hp.dropout, batch_first=True, norm_first=True)

    def forward(self, src: Tensor, tgt: Tensor, src_pad: Tensor) -> Tensor:
        return self.net(src, tgt, tgt_mask=causal_mask(tgt.shape[1], tgt), src_key_padding_mask=src_pad,
                        memory_key_padding_mask=src_pad, tgt_is_causal=True)


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """[N, T, H] -> [N, heads, T, H / heads]."""
    n, t, h = x.shape
    return x.view(n, t, heads, h // heads).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    """[N, heads, T, d] -> [N, T, heads * d]."""
    n, heads, t, d = x.shape
    return x.transpose(1, 2).reshape(n, t, heads * d)


@models.register("transformer")
class Transformer(EncoderDecoder):
    learned_positions = True

    def make_body(self, hp: HParams) -> nn.Module:
        return TransformerBody(hp)

    @property
    def _net(self) -> nn.Transformer:
        return self.body.net

    def encode(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        src_pad = inputs == PAD_ID                                        # [B, S]
        memory = self._net.encoder(self.src_bottom(inputs), src_key_padding_mask=src_pad)
        return memory, src_pad                                            # [B, S, H]

    def decode_body(self, tgt: Tensor, state: DecodeState) -> Tensor:
        return self._net.decoder(tgt, state.memory, tgt_mask=causal_mask(tgt.shape[1], tgt),
                                 memory_key_padding_mask=state.src_pad, tgt_is_causal=True)

    def empty_cache(self, state: DecodeState) -> tuple[Tensor, ...]:
        """Per layer: self-attention keys and values, each [N, heads, 0, d]."""
        n, heads = state.memory.shape[0], self.hp.num_heads
        empty = state.memory.new_zeros((n, heads, 0, self.hp.hidden_size // heads))
        return tuple(empty for _ in range(2 * len(self._net.decoder.layers)))

    def encode_for_decoding(self, inputs: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """The source cache holds, per layer, the cross-attention keys and values of the encoder
        output, each [B, heads, S, d]."""
        memory, src_pad = self.encode(inputs)
        h, heads = self.hp.hidden_size, self.hp.num_heads
        out: list[Tensor] = []
        for layer in self._net.decoder.layers:
            attn = layer.multihead_attn
            kv = F.linear(memory, attn.in_proj_weight[h:], attn.in_proj_bias[h:])  # [B, S, 2H]
            out.extend(_split_heads(part, heads) for part in kv.chunk(2, dim=-1))
        return memory, src_pad, tuple(out)

    def cached_step(self, tokens: Tensor, state: DecodeState) -> tuple[Tensor, tuple[Tensor, ...]]:
        h, heads = self.hp.hidden_size, self.hp.num_heads
        x = self.tgt_bottom.embed_step(tokens, state.steps)[:, None]     # [N, 1, H]
        keep = ~state.src_pad[:, None, None, :]                            # [N, 1, 1, S]
        cache: list[Tensor] = []
        for i, layer in enumerate(self._net.decoder.layers):
            self_attn, cross_attn = layer.self_attn, layer.multihead_attn
            qkv = F.linear(layer.norm1(x), self_attn.in_proj_weight, self_attn.in_proj_bias)  # [N, 1, 3H]
            q, k, v = (_split_heads(part, heads) for part in qkv.chunk(3, dim=-1))          # [N, h, 1, d]
            keys = torch.cat([state.cache[2 * i], k], dim=2)                # [N, h, t+1, d]
            values = torch.cat([state.cache[2 * i + 1], v], dim=2)
            cache += [keys, values]
            attended = F.scaled_dot_product_attention(q, keys, values)     # [N, h, 1, d]
            x = x + layer.dropout1(self_attn.out_proj(_merge_heads(attended)))
            q = _split_heads(F.linear(layer.norm2(x), cross_attn.in_proj_weight[:h],
                                      cross_attn.in_proj_bias[:h]), heads)  # [N, h, 1, d]
            mem_k, mem_v = state.source_cache[2 * i], state.source_cache[2 * i + 1]
            attended = F.scaled_dot_product_attention(q, mem_k, mem_v, attn_mask=keep)
            x = x + layer.dropout2(cross_attn.out_proj(_merge_heads(attended)))
            ff = layer.linear2(layer.dropout(layer.activation(layer.linear1(layer.norm3(x)))))
            x = x + layer.dropout3(ff)
        norm = self._net.decoder.norm
        out = norm(x) if norm is not None else x
        return out[:, 0], tuple(cache)                                      # [N, H]


@hparams_sets.register("transformer_algorithmic")
def transformer_algorithmic() -> AlgorithmicHParams:
    """Small enough to solve reverse/copy on 2 CPU cores in about a minute."""
    return AlgorithmicHParams(hidden_size=64, num_layers=2, num_heads=4, filter_size=128,
                              dropout=0.0, batch_size=64, learning_rate=3e-3, optimizer="adam",
                              lr_schedule="cosine", warmup_steps=100, max_grad_norm=1.0,
                              max_steps=2000)


@hparams_sets.register("transformer_base")
def transformer_base() -> Seq2SeqHParams:
    """"Attention is all you need" base: d 512, 6+6 layers, 8 heads, FFN 2048, dropout 0.1,
    label smoothing 0.1, tied (and, for a shared vocabulary, shared) embeddings, Adam
    0.9/0.98/1e-9, linear warmup 4000 steps then 1/sqrt(step); the peak rate is the paper's
    d^-0.5 * 4000^-0.5 (7e-4); 4096-token batches."""
    return Seq2SeqHParams(hidden_size=512, num_layers=6, num_heads=8, filter_size=2048, dropout=0.1,
                          label_smoothing=0.1, tie_embeddings=True, shared_embeddings=True,
                          batch_tokens=4096, optimizer="adam", adam_beta1=0.9, adam_beta2=0.98,
                          adam_epsilon=1e-9, learning_rate=7e-4, lr_schedule="rsqrt_decay",
                          warmup_steps=4000)


@hparams_sets.register("transformer_base_small")
def transformer_base_small() -> Seq2SeqHParams:
    """transformer_base sized for a CPU: d 256, 3+3 layers, 4 heads, FFN 1024 (peak rate 1e-3)."""
    return transformer_base().replace(hidden_size=256, num_layers=3, num_heads=4, filter_size=1024,
                                      learning_rate=1e-3)
