"""Importing hotloop enlarges oneDNN's primitive cache unless the user set it."""
from __future__ import annotations

import os
import subprocess
import sys


def _capacity_after_import(env: dict[str, str]) -> str:
    code = "import hotloop, os; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_sets_a_large_primitive_cache_and_a_users_value_wins() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    assert _capacity_after_import(env) == "16384"
    assert _capacity_after_import({**env, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}) == "512"
