"""Fixtures of the export tests (helpers live in export_helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from export_helpers import save_run


@pytest.fixture
def conv_run(tmp_path: Path) -> Path:
    return save_run(tmp_path / "run", "image_synthetic", "conv_net", "conv_net_base",
                    "conv_channels=4:8,image_size=8")
