"""Sampling continuations from a language model (temperature, top-k, nucleus/top-p, seeded).

The model is any :class:`~hotloop.models.base.SequenceModel` for an ``lm``
task whose ``forward({"inputs": [B, T]}, state) -> (logits [B, T, V], state)``
carries a recurrent state: the prompt is fed once, then one token per step.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["filter_logits", "sample_lm"]


def filter_logits(logits: Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Scale by 1/temperature, keep the ``top_k`` best and the smallest set with mass >= ``top_p``.

    logits [B, V] -> [B, V] with removed entries at -inf (the best token is always kept).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use top_k=1 for greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]                  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)             # [B, V]
        probs = ordered.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs                        # mass of the better tokens
        ordered = ordered.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return logits


@torch.no_grad()
def sample_lm(model: Any, prompts: Tensor, *, max_new_tokens: int, stop_id: int, temperature: float = 1.0,
              top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
              check_every: int = 8) -> list[list[int]]:
    """Continue each prompt row (prompts [B, P], equal lengths, P >= 1) until ``stop_id`` or
    ``max_new_tokens``; returns the sampled ids per row (``stop_id`` included when reached).
    The host checks whether every row has stopped only every ``check_every`` steps."""
    batch = prompts.shape[0]
    logits, state = model({"inputs": prompts}, None)                      # [B, P, V]
    next_logits = logits[:, -1]
    out = prompts.new_zeros((batch, max_new_tokens))
    stopped = torch.zeros(batch, dtype=torch.bool, device=prompts.device)
    for i in range(max_new_tokens):
        probs = filter_logits(next_logits, temperature=temperature, top_k=top_k, top_p=top_p).softmax(-1)
        token = torch.multinomial(probs, 1, generator=generator)[:, 0]   # [B]
        out[:, i] = token
        stopped |= token == stop_id
        if i + 1 == max_new_tokens or ((i + 1) % check_every == 0 and bool(stopped.all())):
            out = out[:, : i + 1]
            break
        logits, state = model({"inputs": token[:, None]}, state)          # [B, 1, V]
        next_logits = logits[:, -1]
    rows = out.tolist()
    return [row[: row.index(stop_id) + 1] if stop_id in row else row for row in rows]
