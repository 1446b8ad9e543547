"""A tiny BERT classification problem and hparams for the fine-tuning tests (no data files)."""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from hotloop.engine import Strategy
from hotloop.models.bert import BERT, BertHParams
from hotloop.problems.algorithmic import generated_reader
from hotloop.problems.base import Problem, ProblemSpec
from hotloop.train import Trainer

torch.set_num_threads(1)

VOCAB, LENGTH = 40, 12


class _Rows:
    """``rng -> batch``: random ids after [CLS] (3); the class is the first id modulo ``classes``."""

    def __init__(self, batch_size: int, classes: int) -> None:
        self.batch_size, self.classes = batch_size, classes

    def __call__(self, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        ids = rng.integers(5, VOCAB, size=(self.batch_size, LENGTH))
        ids[:, 0] = 3
        ids[:, -2:] = 0                                                   # padding
        return {"inputs": torch.from_numpy(ids), "segment_ids": torch.zeros(self.batch_size, LENGTH, dtype=torch.long),
                "targets": torch.from_numpy(ids[:, 1:2] % self.classes)}


class TinyPairs(Problem):
    """A classify problem for bert: 8 train and 4 valid batches."""

    task: ClassVar[str] = "classify"

    def __init__(self, classes: int = 2) -> None:
        super().__init__()
        self.classes = classes

    def spec(self, hp: Any) -> ProblemSpec:
        return ProblemSpec("classify", VOCAB, self.classes, LENGTH, 1, pad_id=0)

    def reader(self, split: str, hp: Any, *, seed: int = 0, shuffle: bool | None = None, workers: int = 0) -> Any:
        return generated_reader(_Rows(hp.batch_size, self.classes), split, hp, train_examples=8 * hp.batch_size,
                                eval_examples=4 * hp.batch_size, seed=hp.seed + seed)


def tiny_bert_hp(**changes: Any) -> BertHParams:
    base = dict(hidden_size=16, num_layers=2, num_heads=2, filter_size=32, max_positions=16, dropout=0.0,
                attention_dropout=0.0, batch_size=8, optimizer="adamw", learning_rate=1e-3, weight_decay=0.01,
                max_steps=2)
    return BertHParams(**{**base, **changes})


def tiny_bert(hp: BertHParams | None = None, classes: int = 2, task: str = "classify", seed: int = 0) -> BERT:
    hp = hp or tiny_bert_hp()
    torch.manual_seed(seed)
    spec = ProblemSpec(task, VOCAB, classes if task == "classify" else VOCAB, LENGTH, 1 if task == "classify" else 4,
                       pad_id=0)
    return BERT(hp, spec)


def tiny_trainer(model: BERT | None = None, *, hp: BertHParams | None = None, classes: int = 2,
                 **kwargs: Any) -> Trainer:
    hp = hp or tiny_bert_hp()
    model = model if model is not None else tiny_bert(hp, classes)
    return Trainer(TinyPairs(classes), model, hp, strategy=Strategy(sync_every=1), loggers=[], **kwargs)


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
