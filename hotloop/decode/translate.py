"""Translate token-id sentences with a seq2seq model: length-sorted batches, results in input order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from ..problems.base import EOS_ID, PAD_ID
from .search import beam_search, greedy_search, max_target_lengths

__all__ = ["DecodeOptions", "pad_batch", "strip_ids", "fit_source", "decode_batch", "length_sorted",
           "translate_ids"]


@dataclass(frozen=True)
class DecodeOptions:
    """How to search: ``beam_size`` 1 is greedy; the output may have at most ``max_extra`` tokens more
    than the source (EOS included on both sides), capped by the model's longest target; ``cached``
    False re-runs the decoder over the whole prefix each step (the reference path)."""

    beam_size: int = 1
    alpha: float = 0.6
    max_extra: int = 50
    cached: bool = True
    check_every: int = 8     # steps between the host's "all finished?" checks

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam size must be >= 1, got {self.beam_size}")
        if self.max_extra < 0:
            raise ValueError(f"max extra length must be >= 0, got {self.max_extra}")


def pad_batch(seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> Tensor:
    """Right-pad with PAD_ID -> int64 [B, max len]."""
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), max(width, 1)), PAD_ID, dtype=torch.int64)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.int64)
    return out.to(device)


def strip_ids(row: Iterable[int]) -> list[int]:
    """Ids up to (not including) the first EOS, padding dropped."""
    out = []
    for i in row:
        if i == EOS_ID:
            break
        if i != PAD_ID:
            out.append(int(i))
    return out


def fit_source(ids: list[int], max_length: int) -> tuple[list[int], bool]:
    """Cut ``ids`` to ``max_length`` tokens keeping its final EOS; returns (ids, whether it was cut)."""
    if max_length <= 0 or len(ids) <= max_length:
        return ids, False
    return ids[: max_length - 1] + [EOS_ID], True


def decode_batch(model: Any, sources: Sequence[Sequence[int]], options: DecodeOptions,
                 device: torch.device | str) -> list[list[int]]:
    """Decode one batch of source ids (each ending in EOS) -> output ids per sentence (no EOS)."""
    inputs = pad_batch(sources, device)                                   # [B, S]
    lengths = max_target_lengths(inputs, extra=options.max_extra, cap=model.max_decode_length)
    if options.beam_size == 1:
        tokens = greedy_search(model, inputs, lengths, cached=options.cached, check_every=options.check_every)
    else:
        tokens = beam_search(model, inputs, lengths, beam_size=options.beam_size, alpha=options.alpha,
                             cached=options.cached, check_every=options.check_every).tokens
    return [strip_ids(row) for row in tokens.tolist()]


def length_sorted(items: Sequence[tuple[int, list[int]]], batch_size: int) -> Iterator[list[tuple[int, list[int]]]]:
    """Batches of (index, ids) sorted by length, longest first (similar lengths pad little)."""
    ordered = sorted(items, key=lambda item: -len(item[1]))
    for start in range(0, len(ordered), batch_size):
        yield ordered[start: start + batch_size]


def translate_ids(model: Any, sources: Sequence[list[int]], options: DecodeOptions, *, batch_size: int = 64,
                  device: torch.device | str = "cpu",
                  on_batch: Callable[[list[tuple[int, list[int]]]], None] | None = None) -> list[list[int]]:
    """Decode every source (sorted into batches by length); results in input order.

    ``on_batch`` gets each finished batch as (input index, output ids) pairs."""
    results: list[list[int]] = [[] for _ in sources]
    for batch in length_sorted(list(enumerate(sources)), batch_size):
        outputs = decode_batch(model, [ids for _, ids in batch], options, device)
        done = [(index, out) for (index, _), out in zip(batch, outputs)]
        for index, out in done:
            results[index] = out
        if on_batch is not None:
            on_batch(done)
    return results
