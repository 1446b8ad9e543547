"""Shared helpers for the trainer tests: a tiny transformer run, list readers, a tiny streamed LM."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import hotloop  # noqa: F401 - declares the built-ins
from hotloop.data import stream_windows
from hotloop.engine import Strategy
from hotloop.hparams import get_hparams
from hotloop.problems.base import Problem, ProblemSpec
from hotloop.registry import models, problems
from hotloop.train import Trainer
from hotloop.train.build import build_model
from hotloop.train.loggers import default_loggers

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2,max_steps=10")


def tiny_hp(extra: str = ""):
    return get_hparams("transformer_algorithmic", TINY + ("," + extra if extra else ""))


_DEFAULT = Strategy(prefetch=0)


def make_trainer(out: Path | None, hp=None, *, strategy: Any = _DEFAULT, problem: Any = None,
                 model_name: str = "transformer", **kwargs: Any) -> Trainer:
    hp = hp if hp is not None else tiny_hp()
    problem = problem if problem is not None else problems.get("algorithmic_reverse")()
    model = build_model(models.get(model_name), hp, problem.spec(hp))
    kwargs.setdefault("loggers", default_loggers(out, console=False))
    strategy = "auto" if strategy is None else strategy  # None: exercise strategy="auto"
    return Trainer(problem, model, hp, strategy=strategy, output_dir=out, **kwargs)


def params_of(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


class ListReader:
    """A resumable reader over a fixed list of batches (same batches every epoch)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches, self.epoch, self.index = batches, 0, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        while self.index < len(self.batches):
            self.index += 1
            yield self.batches[self.index - 1]
        self.index, self.epoch = 0, self.epoch + 1

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.index = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


class TinyStreamLM(Problem):
    """A streamed LM over a fixed random token stream: [B, T] windows, contiguous per row."""

    task = "lm"
    vocab = 12

    def spec(self, hp) -> ProblemSpec:
        return ProblemSpec(task="lm", input_vocab_size=self.vocab, target_vocab_size=self.vocab,
                           streamed=True, pad_id=-1)

    def reader(self, split, hp, *, seed=0, shuffle=None):
        rng = np.random.default_rng({"train": 0, "valid": 1, "test": 2}[split])
        return stream_windows(rng.integers(0, self.vocab, size=hp.batch_size * 41), hp.batch_size, hp.max_length)


def tiny_lm_hp(extra: str = ""):
    base = ("hidden_size=16,num_layers=2,batch_size=4,max_length=5,max_epochs=0,max_steps=12,"
            "dropout=0.2,learning_rate=0.5,lr_schedule=constant,fused_ce=false")
    return get_hparams("lstm_lm_small", base + ("," + extra if extra else ""))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "run"
