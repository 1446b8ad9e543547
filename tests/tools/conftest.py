"""Tiny problem/model fixtures shared by the autotune and profile tests."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hotloop.models.base import SequenceModel
from hotloop.problems.algorithmic import AlgorithmicHParams
from hotloop.registry import problems


class TinyTagger(SequenceModel):
    """A user model that is *not* registered: embedding -> linear -> tanh -> output, per position."""

    tasks = ("seq2seq",)

    def __init__(self, hp, spec) -> None:
        super().__init__(hp, spec)
        self.embed = nn.Embedding(spec.input_vocab_size, hp.hidden_size)
        self.mix = nn.Linear(hp.hidden_size, hp.hidden_size)
        self.out = nn.Linear(hp.hidden_size, spec.target_vocab_size)

    def forward(self, batch, state=None):
        x = self.embed(batch["inputs"])                       # [B, S, H]
        steps = batch["targets"].shape[1]
        x = nn.functional.pad(x, (0, 0, 0, max(0, steps - x.shape[1])))[:, :steps]  # [B, T, H]
        return self.out(torch.tanh(self.mix(x))), None        # [B, T, V]


@pytest.fixture
def tiny_hp() -> AlgorithmicHParams:
    return AlgorithmicHParams(hidden_size=16, batch_size=8, train_length=6, eval_length=6,
                              train_examples=512, learning_rate=1e-2, max_grad_norm=1.0, seed=3)


@pytest.fixture
def copy_problem():
    return problems.get("algorithmic_copy")()


@pytest.fixture
def tiny_model(tiny_hp, copy_problem):
    torch.manual_seed(0)
    return TinyTagger(tiny_hp, copy_problem.spec(tiny_hp))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets its own autotune cache directory."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def one_thread():
    """The cores are shared: one intra-op thread keeps these logic tests fast under load."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
