"""Fixtures of the multi-problem tests: tiny runs on algorithmic problems and synthetic images."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Two cores are shared by many processes: every test here uses the shared ``one_thread`` fixture."""
    yield
