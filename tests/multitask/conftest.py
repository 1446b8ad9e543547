"""Fixtures of the multi-problem tests: tiny runs on algorithmic problems and synthetic images."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Two cores are shared by many processes: keep every test on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
