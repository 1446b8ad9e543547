"""Importing hotloop changes nothing in the process; apply_process_settings enlarges oneDNN's
primitive cache unless the user set it, and says so."""
from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
import os, hotloop
print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY', 'unset'))
from hotloop.engine.process_settings import apply_process_settings
lines = apply_process_settings()
print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])
print(lines[0])
"""


def _run(env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-3:]


def test_import_changes_nothing_and_the_settings_enlarge_the_cache_unless_the_user_set_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    assert _run(env) == ["unset", "16384", "oneDNN primitive cache: 16384 entries"]
    assert _run({**env, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}) == [
        "512", "512", "oneDNN primitive cache: 512 entries (ONEDNN_PRIMITIVE_CACHE_CAPACITY set by the user)"]
