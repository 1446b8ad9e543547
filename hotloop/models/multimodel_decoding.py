"""Decoding one seq2seq task of a :class:`~hotloop.models.multimodel.MultiModel`.

``MultiModel.decoder_for(task)`` returns a :class:`TaskDecoder`: the model seen as an
incremental decoder (``start_decoding`` / ``decode_step``, see
:mod:`hotloop.decode.search`) for that task. The decoder's first position is the task's
learned token, as in training (``TextBottom(..., prefix=task token)``), and each step
re-runs the shared body over the prefix: ``[task, y1..yt]`` -> the logits of ``y(t+1)``.
Greedy search, beam search, ``hotloop decode`` and BLEU then work on multi-problem runs.

``MultiModel.task_view(task)`` returns a :class:`TaskView`: the model seen as the
single-problem model of one task (that task's ``spec``, batches tagged with the task), which
is what ``hotloop export --task`` writes as an ONNX / OpenVINO graph.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..problems.base import PAD_ID, Batch
from ..problems.mixing import tag_batch
from .encoder_decoder import DecodeState
from .multimodel import MultiModel, _module_key
from .transformer import causal_mask

if TYPE_CHECKING:
    from ..problems.multi_problem import TaskSpec

__all__ = ["TaskDecoder", "TaskView"]


class TaskDecoder(nn.Module):
    """``model`` decoding ``task`` (a seq2seq task of the run); the parameters are the model's."""

    def __init__(self, model: MultiModel, task: "TaskSpec") -> None:
        super().__init__()
        self.model, self.task = model, task
        key = _module_key(task.vocabulary)
        self.embed, self.top = model.embeddings[key], model.softmax[key]

    @property
    def max_decode_length(self) -> int:
        """Target tokens the learned positions allow (the task token takes the first position)."""
        return self.embed.positions.num_embeddings

    def start_decoding(self, inputs: Tensor, *, beam_size: int = 1, cached: bool = True) -> DecodeState:
        """Encode ``inputs`` [B, S] once; rows ``b*K .. b*K+K-1`` are sentence ``b``'s beams.

        Every step re-runs the decoder over the prefix (``cached`` is accepted and has no effect)."""
        src_pad = inputs == PAD_ID                                                # [B, S]
        memory = self.model.body.net.encoder(self.embed(inputs), src_key_padding_mask=src_pad)  # [B, S, H]
        if beam_size > 1:
            memory, src_pad = (t.repeat_interleave(beam_size, dim=0) for t in (memory, src_pad))
        return DecodeState(memory, src_pad, prefix=inputs.new_empty((memory.shape[0], 0)))

    def decode_step(self, tokens: Tensor, state: DecodeState) -> tuple[Tensor, DecodeState]:
        """Feed ``tokens`` [N] -> (logits [N, V], next state). The first fed token (START) stands for
        the task token."""
        assert state.prefix is not None
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)                # [N, t+1]
        n = prefix.shape[0]
        ids = torch.cat([prefix[:, 1:], prefix[:, :1]], dim=1)                    # last id is dropped
        task = self.model.task_token(self.task, n)                                # [N, 1, H]
        tgt = self.embed(ids, prefix=task)                                        # [N, t+1, H]: task, y1..yt
        hidden = self.model.body.net.decoder(tgt, state.memory, tgt_mask=causal_mask(tgt.shape[1], tgt),
                                             memory_key_padding_mask=state.src_pad, tgt_is_causal=True)
        return self.top(hidden[:, -1]), replace(state, steps=state.steps + 1, prefix=prefix)   # [N, V]


class TaskView(nn.Module):
    """``model`` as the one-problem model of ``task``: ``spec`` is the task's, and each batch gets
    the task's tag; stateless (a multimodel LM carries no state between batches)."""

    def __init__(self, model: MultiModel, task: "TaskSpec") -> None:
        super().__init__()
        self.model, self.task = model, task
        self.hp, self.spec = model.hp, task.spec

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        return self.model(tag_batch(batch, self.task.name, self.task.index), state)

    def initial_state(self, batch_size: int, device: torch.device) -> None:
        return None
