"""A multi-layer perceptron over the whole (padded) input, for fixed-length problems."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..hparams import HParams
from ..problems.algorithmic import AlgorithmicHParams
from ..problems.base import Batch, ProblemSpec
from ..registry import hparams_sets, models
from .base import SequenceModel

__all__ = ["MLP", "MLPBody"]


class MLPBody(nn.Module):
    """[B, D] -> [B, D]: ``num_layers`` residual blocks of Linear-ReLU-Linear."""

    def __init__(self, width: int, inner: int, num_layers: int, dropout: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, inner), nn.ReLU(),
                          nn.Dropout(dropout), nn.Linear(inner, width))
            for _ in range(num_layers))

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


@models.register("mlp")
class MLP(SequenceModel):
    """Bottom: token embedding flattened over positions; body: MLP; top: per-position logits.

    Needs ``spec.max_input_length`` and ``spec.max_target_length`` (fixed-size I/O).
    """

    tasks = ("seq2seq", "classify")

    def __init__(self, hp: HParams, spec: ProblemSpec, body: nn.Module | None = None) -> None:
        super().__init__(hp, spec)
        self.in_len = max(spec.max_input_length, 1)
        self.out_len = max(spec.max_target_length, 1)
        self.embed = nn.Embedding(spec.input_vocab_size, hp.hidden_size)
        width = self.in_len * hp.hidden_size
        self.body = body if body is not None else MLPBody(width, hp.filter_size, hp.num_layers, hp.dropout)
        self.norm = nn.LayerNorm(width)
        self.top = nn.Linear(width, self.out_len * spec.target_vocab_size)

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        inputs = batch["inputs"][:, : self.in_len]
        b, s = inputs.shape
        if s < self.in_len:  # right-pad short batches to the fixed width
            inputs = nn.functional.pad(inputs, (0, self.in_len - s), value=self.spec.pad_id)
        x = self.embed(inputs).reshape(b, -1)              # [B, S*H]
        x = self.norm(self.body(x))
        logits = self.top(x).reshape(b, self.out_len, -1)  # [B, T_max, V]
        t = batch["targets"].shape[1]
        return logits[:, :t], None


@hparams_sets.register("mlp_algorithmic")
def mlp_algorithmic() -> AlgorithmicHParams:
    return AlgorithmicHParams(hidden_size=32, num_layers=2, filter_size=512, batch_size=64,
                              learning_rate=2e-3, optimizer="adam", lr_schedule="cosine",
                              warmup_steps=100, max_grad_norm=1.0, max_steps=3000)
