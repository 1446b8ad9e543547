"""Fake incremental decoders with fixed log-probabilities (imported by the decode tests)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from hotloop.problems.base import EOS_ID


@dataclass
class PrefixState:
    prefix: Tensor   # [N, t] tokens fed so far (START first)

    def reorder(self, index: Tensor) -> "PrefixState":
        return replace(self, prefix=self.prefix.index_select(0, index))


class TableDecoder:
    """Next-token probabilities looked up by the generated prefix (START dropped).

    ``table[prefix] = {token: prob}``; unlisted prefixes end (EOS with prob 1).
    Ids: 0 PAD (never emitted), 1 EOS, 2.. words. ``decode_step`` returns log-probs as logits.
    """

    max_decode_length = None

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int = 4) -> None:
        self.table, self.vocab = table, vocab

    def logprobs(self, prefix: tuple[int, ...]) -> list[float]:
        probs = self.table.get(prefix, {EOS_ID: 1.0})
        return [math.log(probs[t]) if probs.get(t, 0) > 0 else -math.inf for t in range(self.vocab)]

    def start_decoding(self, inputs: Tensor, *, beam_size: int = 1, cached: bool = True) -> PrefixState:
        return PrefixState(inputs.new_zeros((inputs.shape[0] * beam_size, 0)))

    def decode_step(self, tokens: Tensor, state: PrefixState) -> tuple[Tensor, PrefixState]:
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        rows = [self.logprobs(tuple(r[1:])) for r in prefix.tolist()]
        return torch.tensor(rows, dtype=torch.float64), PrefixState(prefix)


class RandomTableDecoder(TableDecoder):
    """Every prefix gets its own fixed random distribution over EOS and the words."""

    def __init__(self, vocab: int = 4, seed: int = 0) -> None:
        super().__init__({}, vocab)
        self.seed = seed

    def logprobs(self, prefix: tuple[int, ...]) -> list[float]:
        gen = torch.Generator().manual_seed(hash((self.seed,) + prefix) % (2 ** 31))
        weights = torch.rand(self.vocab, generator=gen, dtype=torch.float64) ** 3
        weights[0] = 0.0
        return (weights / weights.sum()).log().tolist()
