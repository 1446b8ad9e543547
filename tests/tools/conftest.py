"""Tiny problem/model fixtures shared by the autotune and profile tests (helpers: tests/helpers.py)."""
from __future__ import annotations

import pytest
import torch
from helpers import TinyTagger

from hotloop.problems.algorithmic import AlgorithmicHParams
from hotloop.registry import problems


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
