"""The import layers of docs/architecture.md hold (``lint-imports``), and an upward import breaks them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the tree at ``root`` (its pyproject.toml, its hotloop/ first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [str(LINT)] if LINT.exists() else [sys.executable, "-m", "importlinter.cli"]
    return subprocess.run(command + ["--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=240)


def test_layers_hold_on_this_tree():
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_an_upward_import_breaks_the_layers(tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(REPO / "hotloop", copy / "hotloop", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    kept = _lint(copy)
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-2000:]
    assert "1 kept, 0 broken" in kept.stdout

    base = copy / "hotloop" / "models" / "base.py"
    base.write_text(base.read_text() + "\nfrom hotloop.cli import main  # an upward import\n")
    broken = _lint(copy)
    assert broken.returncode != 0, broken.stdout[-3000:]
    assert "BROKEN" in broken.stdout and "hotloop.models.base -> hotloop.cli" in broken.stdout, broken.stdout[-3000:]
