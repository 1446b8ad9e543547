"""Greedy and beam search over an incremental seq2seq decoder, batched on the device.

The model gives ``start_decoding(inputs, beam_size=, cached=)`` and
``decode_step(tokens [N], state) -> (logits [N, V], state)``; the state has
``reorder(index)`` (see :class:`hotloop.models.encoder_decoder.DecodeState`).
Beam search runs sentences x beams as one batch of rows, one forward per
step; which hypotheses are finished lives in device tensors, and the host
looks at them only every ``check_every`` steps to end the loop early.

Scores follow T2T: a hypothesis of ``L`` tokens (its EOS included) with summed
log-probability ``s`` scores ``s / ((5 + L) / 6) ** alpha`` (GNMT). As in
fairseq, an EOS candidate is finished only when it ranks among the step's top
``K`` candidates, so ``beam_size=1`` is exactly greedy search. A sentence stops
when it has ``K`` finished hypotheses or when no alive hypothesis can still
beat its best finished one. Every sentence ends by its own ``max_lengths``:
the last allowed token is EOS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.encoder_decoder import START_ID
from ..problems.base import EOS_ID, PAD_ID

__all__ = ["IncrementalDecoder", "BeamResult", "length_penalty", "max_target_lengths",
           "greedy_search", "beam_search", "START_ID"]


class IncrementalDecoder(Protocol):
    def start_decoding(self, inputs: Tensor, *, beam_size: int = 1, cached: bool = True) -> Any: ...
    def decode_step(self, tokens: Tensor, state: Any) -> tuple[Tensor, Any]: ...


@dataclass
class BeamResult:
    tokens: Tensor   # [B, T] the best hypothesis, EOS included, PAD after
    scores: Tensor   # [B] its length-penalised log-probability


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (T2T's beam search)."""
    return ((5.0 + length) / 6.0) ** alpha


def max_target_lengths(inputs: Tensor, *, extra: int = 50, cap: int | None = None) -> Tensor:
    """Per sentence: its source length (non-pad tokens, EOS included) + ``extra``, at most ``cap``. [B]."""
    lengths = (inputs != PAD_ID).sum(dim=1) + extra
    return lengths.clamp(min=1, max=cap) if cap else lengths.clamp(min=1)


def _trim(tokens: Tensor, steps: int) -> Tensor:
    """Drop the all-PAD columns at the end (the loop may run up to ``check_every`` steps too long)."""
    used = (tokens[:, :steps] != PAD_ID).any(dim=0).nonzero()
    return tokens[:, : int(used[-1]) + 1 if len(used) else 0]


@torch.no_grad()
def greedy_search(model: IncrementalDecoder, inputs: Tensor, max_lengths: Tensor, *,
                  cached: bool = True, check_every: int = 8) -> Tensor:
    """Most likely next token each step. inputs [B, S] -> tokens [B, T] (EOS included, PAD after)."""
    batch, limit = inputs.shape[0], int(max_lengths.max())
    state = model.start_decoding(inputs, beam_size=1, cached=cached)
    out = inputs.new_full((batch, limit), PAD_ID)                       # [B, T]
    finished = torch.zeros(batch, dtype=torch.bool, device=inputs.device)
    tokens = inputs.new_full((batch,), START_ID)
    steps = limit
    for i in range(limit):
        logits, state = model.decode_step(tokens, state)                # [B, V]
        best = logits.argmax(dim=-1)
        best = torch.where(max_lengths <= i + 1, EOS_ID, best)          # the last allowed token
        best = torch.where(finished, PAD_ID, best)
        out[:, i] = best
        finished |= best == EOS_ID
        tokens = best
        if (i + 1) % check_every == 0 and bool(finished.all()):
            steps = i + 1
            break
    return _trim(out, steps)


@torch.no_grad()
def beam_search(model: IncrementalDecoder, inputs: Tensor, max_lengths: Tensor, *, beam_size: int,
                alpha: float = 0.6, cached: bool = True, check_every: int = 8) -> BeamResult:
    """Batched beam search. inputs [B, S], max_lengths [B] -> the best hypothesis per sentence."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    batch, k, device = inputs.shape[0], beam_size, inputs.device
    limit = int(max_lengths.max())
    state = model.start_decoding(inputs, beam_size=k, cached=cached)
    neg_inf = float("-inf")
    alive_seq = inputs.new_full((batch, k, limit), PAD_ID)                      # [B, K, T]
    alive_logp = torch.full((batch, k), neg_inf, device=device)                 # [B, K]
    alive_logp[:, 0] = 0.0                                                      # one live beam at first
    fin_seq = alive_seq.clone()                                                 # [B, K, T]
    fin_score = torch.full((batch, k), neg_inf, device=device)                  # [B, K], sorted
    done = torch.zeros(batch, dtype=torch.bool, device=device)                  # [B]
    row_base = torch.arange(batch, device=device)[:, None] * k                  # [B, 1]
    in_top_k = torch.arange(2 * k, device=device) < k                           # [2K]
    best_possible_penalty = length_penalty(max_lengths.float(), alpha)          # [B]
    tokens = inputs.new_full((batch * k,), START_ID)
    steps = limit
    for i in range(limit):
        logits, state = model.decode_step(tokens, state)                        # [B*K, V]
        vocab = logits.shape[-1]
        logp = F.log_softmax(logits.float(), dim=-1).view(batch, k, vocab)      # [B, K, V]
        eos_only = torch.full((vocab,), neg_inf, device=device)
        eos_only[EOS_ID] = 0.0
        logp = torch.where((max_lengths <= i + 1)[:, None, None], eos_only, logp)
        candidates = (alive_logp[:, :, None] + logp).view(batch, k * vocab)     # [B, K*V]
        top_logp, top_index = candidates.topk(2 * k, dim=1)                     # [B, 2K]
        origin, token = top_index // vocab, top_index % vocab
        seqs = alive_seq.gather(1, origin[:, :, None].expand(-1, -1, limit))    # [B, 2K, T]
        seqs[:, :, i] = token
        is_eos = token == EOS_ID
        # finished: EOS candidates ranked in the step's top K (frozen once a sentence is done)
        new_fin = torch.where(is_eos & in_top_k & ~done[:, None],
                              top_logp / length_penalty(float(i + 1), alpha), neg_inf)
        fin_score, pick = torch.cat([fin_score, new_fin], dim=1).topk(k, dim=1)  # [B, K]
        fin_seq = torch.cat([fin_seq, seqs], dim=1).gather(1, pick[:, :, None].expand(-1, -1, limit))
        # alive: the best K candidates that did not end
        alive_logp, pick = torch.where(is_eos, neg_inf, top_logp).topk(k, dim=1)  # [B, K]
        alive_seq = seqs.gather(1, pick[:, :, None].expand(-1, -1, limit))
        state = state.reorder((row_base + origin.gather(1, pick)).reshape(-1))
        tokens = alive_seq[:, :, i].reshape(-1)
        has_best = fin_score[:, 0] > neg_inf
        unbeatable = has_best & (fin_score[:, 0] >= alive_logp[:, 0] / best_possible_penalty)
        done |= (fin_score[:, -1] > neg_inf) | unbeatable
        if (i + 1) % check_every == 0 and bool(done.all()):
            steps = i + 1
            break
    return BeamResult(_trim(fin_seq[:, 0], steps), fin_score[:, 0])
