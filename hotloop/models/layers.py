"""Shared bottoms and tops: token embeddings (+ positions) and the output projection."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["TokenEmbedding", "OutputTop", "shift_right"]


class TokenEmbedding(nn.Module):
    """ids [B, T] -> [B, T, H], scaled by sqrt(H), plus learned positions if ``max_len``."""

    def __init__(self, vocab_size: int, hidden: int, max_len: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(max_len, hidden) if max_len else None
        self.scale = math.sqrt(hidden)
        self.dropout = nn.Dropout(dropout)
        nn.init.normal_(self.tokens.weight, std=hidden ** -0.5)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.tokens(ids) * self.scale
        if self.positions is not None:
            x = x + self.positions.weight[: ids.shape[1]]
        return self.dropout(x)

    def embed_step(self, ids: Tensor, position: int) -> Tensor:
        """ids [N] at target position ``position`` -> [N, H] (one incremental decoding step)."""
        x = self.tokens(ids) * self.scale
        if self.positions is not None:
            x = x + self.positions.weight[position]
        return self.dropout(x)


class OutputTop(nn.Module):
    """[B, T, H] -> logits [B, T, V]."""

    def __init__(self, hidden: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


def shift_right(targets: Tensor, start_id: int = 0) -> Tensor:
    """Decoder inputs: targets shifted one step right, ``start_id`` first. [B, T] -> [B, T]."""
    out = torch.full_like(targets, start_id)
    out[:, 1:] = targets[:, :-1]
    return out
