"""Fixtures of the trainer tests (their helpers live in tests/helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "run"
