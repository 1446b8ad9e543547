"""``benchmarks/norm_layouts.py``: the norm calls it collects are the model's, and every form is timed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from norm_layouts import main, norm_shapes, time_forms  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_cyclegan_norm_shapes_count_both_phases_calls() -> None:
    shapes = norm_shapes("cyclegan")
    assert not shapes["batch_norm"]
    # cyclegan_small: a generator has 11 norms (c7s1, two downsamplings, 3 blocks of two, two
    # upsamplings), a discriminator 3; the generator phase runs six generator passes (fakes, cycles,
    # identities) and two discriminator passes, the discriminator phase four discriminator passes
    assert sum(shapes["instance_norm"].values()) == 6 * 11 + 2 * 3 + 4 * 3, shapes
    assert {shape[0] for shape in shapes["instance_norm"]} == {4}                 # the batch


def test_every_form_is_timed_forward_and_backward(tmp_path: Path, monkeypatch) -> None:
    timed = time_forms("instance_norm", (2, 3, 4, 4), repeats=1)
    assert set(timed) == {"nchw", "channels_last", "per_sample"}
    assert all(parts["forward_ms"] > 0 and parts["backward_ms"] > 0 for parts in timed.values())
    out = tmp_path / "norms.json"
    monkeypatch.setattr(sys, "argv", ["norm_layouts.py", "--models", "yolov3", "--repeats", "1", "--json", str(out)])
    main()
    rows = json.loads(out.read_text())["rows"]
    total = [row for row in rows if "total" in row]
    assert [(row["model"], row["norm"], sorted(row["total"])) for row in total] == [
        ("yolov3", "batch_norm", ["channels_last", "nchw"])]
    assert sum(row["calls"] for row in rows if "calls" in row) == 40
