"""Test modules need unique file names: pytest imports them by basename (the test folders are not packages)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    assert not [n for n, count in names.items() if count > 1], names.most_common(3)
