"""The shared seq2seq shape: source and target embeddings -> body -> output top.

A concrete model names its body (``make_body``) and whether its embeddings
add learned positions; the body contract is
``(src [B, S, H], tgt [B, T, H], src_pad [B, S]) -> [B, T, H]``.

Incremental decoding (used by :mod:`hotloop.decode`)::

    state = model.start_decoding(inputs, beam_size=K)   # encode once; rows = sentence x beam
    logits, state = model.decode_step(last_tokens, state)  # [B*K] -> [B*K, V], one step
    state = state.reorder(index)                          # beam search: rows within a sentence

The first token fed is the start symbol (id 0, as :func:`shift_right` makes it).
With ``cached=False`` each step re-runs the decoder over the whole prefix
(same parameters, same tokens: the reference the cached path is tested against).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..hparams import HParams
from ..problems.base import PAD_ID, Batch, ProblemSpec
from ..problems.translation import Seq2SeqHParams
from .base import LossOutput, ModelMismatchError, SequenceModel, fused_token_stats
from .formulation import FUSED_CE_OPTIONS, FormulationOption
from .layers import OutputTop, TokenEmbedding, shift_right

__all__ = ["EncoderDecoder", "Seq2SeqHParams", "DecodeState", "START_ID"]

START_ID = 0  # the decoder's first input token (shift_right's fill value)


@dataclass
class DecodeState:
    """What an encoder-decoder carries between decode steps; row ``n`` is sentence ``n // beams``.

    ``cache`` holds per-row tensors (batch dimension first) of the model's incremental
    state; ``prefix`` holds the tokens fed so far when decoding without a cache.
    """

    memory: Tensor                  # [N, S, H] encoder output
    src_pad: Tensor                 # [N, S] True at source padding
    steps: int = 0                  # tokens fed so far
    cache: tuple[Tensor, ...] = ()  # model-specific, each [N, ...], reordered with the beams
    source_cache: tuple[Tensor, ...] = ()  # model-specific, from the source only, each [N, ...]
    prefix: Tensor | None = None    # [N, steps] when uncached

    def reorder(self, index: Tensor) -> "DecodeState":
        """Keep rows ``index`` [N]; every row must stay within its own sentence (beam reordering),
        so the source-side tensors are shared and not copied."""
        cache = tuple(t.index_select(0, index) for t in self.cache)
        prefix = None if self.prefix is None else self.prefix.index_select(0, index)
        return replace(self, cache=cache, prefix=prefix)


class EncoderDecoder(SequenceModel):
    tasks = ("seq2seq",)
    learned_positions: ClassVar[bool] = False
    formulation_fields = ("fused_ce", "ce_chunk_rows", "ce_gemm_dtype")

    def __init__(self, hp: HParams, spec: ProblemSpec, body: nn.Module | None = None) -> None:
        super().__init__(hp, spec)
        max_len = max(spec.max_input_length, spec.max_target_length, 1) if self.learned_positions else 0
        self.src_bottom = TokenEmbedding(spec.input_vocab_size, hp.hidden_size, max_len, hp.dropout)
        self.tgt_bottom = TokenEmbedding(spec.target_vocab_size, hp.hidden_size, max_len, hp.dropout)
        self.body = body if body is not None else self.make_body(hp)
        self.top = OutputTop(hp.hidden_size, spec.target_vocab_size)
        if isinstance(hp, Seq2SeqHParams):
            self._tie(hp, spec)

    def _tie(self, hp: Seq2SeqHParams, spec: ProblemSpec) -> None:
        if hp.shared_embeddings:
            if spec.input_vocab_size != spec.target_vocab_size:
                raise ModelMismatchError(f"shared_embeddings needs one vocabulary, but the input has "
                                 f"{spec.input_vocab_size} ids and the target {spec.target_vocab_size}")
            self.src_bottom.tokens.weight = self.tgt_bottom.tokens.weight
        if hp.tie_embeddings:
            self.top.proj.weight = self.tgt_bottom.tokens.weight

    def make_body(self, hp: HParams) -> nn.Module:
        raise NotImplementedError

    def formulation_options(self) -> list[FormulationOption]:
        """The fused output projection + cross-entropy (fp32, or with bf16 GEMM operands)."""
        return list(FUSED_CE_OPTIONS)

    def hidden_states(self, batch: Batch) -> Tensor:
        """The body's output before the output projection: [B, T, H]."""
        inputs, targets = batch["inputs"], batch["targets"]
        src = self.src_bottom(inputs)                     # [B, S, H]
        tgt = self.tgt_bottom(shift_right(targets, START_ID))  # [B, T, H]
        return self.body(src, tgt, inputs == PAD_ID)

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        return self.top(self.hidden_states(batch)), None

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        """Token cross-entropy (label-smoothed while training); with ``fused_ce`` the output
        projection and the loss run chunk by chunk and no logits are returned."""
        form = self.formulation
        if not form.fused_ce or with_accuracy:
            return super().loss(batch, state, with_accuracy=with_accuracy)
        targets = batch["targets"]                                         # [B, T]
        hidden = self.hidden_states(batch)                                 # [B, T, H]
        loss_sum, stats = fused_token_stats(hidden.reshape(-1, hidden.shape[-1]), self.top.proj.weight,
                                            self.top.proj.bias, targets.reshape(-1), form,
                                            training=self.training, examples=targets.shape[0],
                                            label_smoothing=self.hp.label_smoothing, pad_id=self.spec.pad_id)
        tokens = stats["tokens"]
        return LossOutput(loss_sum / tokens.clamp(min=1), stats, None, None, weight=tokens)

    # -- incremental decoding --------------------------------------------------------------
    @property
    def max_decode_length(self) -> int | None:
        """The most target tokens the model can produce (learned positions), or None."""
        positions = self.tgt_bottom.positions
        return None if positions is None else positions.num_embeddings

    def encode(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """inputs [B, S] -> (memory [B, S, H], src_pad [B, S])."""
        raise NotImplementedError

    def start_decoding(self, inputs: Tensor, *, beam_size: int = 1, cached: bool = True) -> DecodeState:
        """Encode ``inputs`` [B, S] once and repeat each sentence ``beam_size`` times (rows b*K..b*K+K-1)."""
        memory, src_pad, source_cache = self.encode_for_decoding(inputs)  # [B, S, H], [B, S], ...
        if beam_size > 1:
            memory, src_pad = (t.repeat_interleave(beam_size, dim=0) for t in (memory, src_pad))
            source_cache = tuple(t.repeat_interleave(beam_size, dim=0) for t in source_cache)
        state = DecodeState(memory, src_pad, source_cache=source_cache)  # rows N = B*K
        if cached:
            return replace(state, cache=self.empty_cache(state))
        return replace(state, prefix=inputs.new_empty((memory.shape[0], 0)))

    def decode_step(self, tokens: Tensor, state: DecodeState) -> tuple[Tensor, DecodeState]:
        """Feed ``tokens`` [N] (the last token of each row) -> (logits [N, V], next state)."""
        if state.prefix is not None:
            prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)   # [N, t+1]
            hidden = self.decode_prefix(prefix, state)                   # [N, H]
            return self.top(hidden), replace(state, steps=state.steps + 1, prefix=prefix)
        hidden, cache = self.cached_step(tokens, state)                  # [N, H]
        return self.top(hidden), replace(state, steps=state.steps + 1, cache=cache)

    def encode_for_decoding(self, inputs: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """(memory [B, S, H], src_pad [B, S], source cache): the source cache holds per-row tensors
        that depend on the source only (never reordered). Default: :meth:`encode`, no source cache."""
        memory, src_pad = self.encode(inputs)
        return memory, src_pad, ()

    def empty_cache(self, state: DecodeState) -> tuple[Tensor, ...]:
        """The per-row incremental state before the first step."""
        raise NotImplementedError

    def cached_step(self, tokens: Tensor, state: DecodeState) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One step from the cache: tokens [N] -> (top-layer output [N, H], new cache)."""
        raise NotImplementedError

    def decode_prefix(self, prefix: Tensor, state: DecodeState) -> Tensor:
        """Re-run the decoder over ``prefix`` [N, t] -> the last position's output [N, H]."""
        tgt = self.tgt_bottom(prefix)                                     # [N, t, H]
        return self.decode_body(tgt, state)[:, -1]

    def decode_body(self, tgt: Tensor, state: DecodeState) -> Tensor:
        """The decoder over embedded targets [N, t, H] given the encoder output -> [N, t, H]."""
        raise NotImplementedError
