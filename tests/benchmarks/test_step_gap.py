"""``benchmarks/step_gap.py``: hotloop's step under the Strategy that matches the expert's settings
gives the expert's losses bit for bit in fp32 (the same math, the same kernels), and its JSON
names each contender's step time and paired ratio."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from expert_loop import ExpertSettings  # noqa: E402
from step_gap import gap_row, main, matching_strategy  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_matching_strategy_says_what_the_expert_does() -> None:
    cpu = torch.device("cpu")
    fused = matching_strategy(ExpertSettings(precision="bf16", optimizer="fused", channels_last=True), cpu)
    assert (fused.precision, fused.fused_optimizer, fused.fused_kernel, fused.channels_last, fused.prefetch) == \
        ("bf16", True, True, True, 0)
    per_tensor = matching_strategy(ExpertSettings(optimizer="per-tensor"), cpu)
    assert not per_tensor.fused_optimizer and not per_tensor.fused_kernel


@pytest.mark.parametrize("name", ["bert", "se_resnext50"])     # a transformer; a conv net in channels_last
def test_hotloops_step_at_the_experts_fp32_settings_gives_its_losses_bitwise(name: str) -> None:
    row = gap_row(name, torch.device("cpu"), precision="fp32", rounds=1, block=3, smoke=True, one_shape=True)
    losses = row["first_losses"]
    assert len(losses["expert"]) == 3 and losses["hotloop"] == losses["expert"]
    assert row["settings"]["precision"] == "fp32" and row["strategy"].get("fused_kernel") is True
    assert set(row["step_ms"]) == {"expert", "hotloop", "expert_one_shape"}
    assert all(ms > 0 for ms in row["step_ms"].values())


def test_json_keeps_every_row(tmp_path: Path) -> None:
    out = tmp_path / "gap.json"
    assert main(["--models", "bert", "--smoke", "--precision", "fp32", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["precision"] == "fp32" and data["smoke"] and [r["model"] for r in data["rows"]] == ["bert"]
    assert data["rows"][0]["vs_expert"]["hotloop"]["verdict"] == "unpaired"     # one round pairs nothing


def test_fed_loops_read_the_problems_batches_and_pair_with_each_other() -> None:
    import multiprocessing
    row = gap_row("bert", torch.device("cpu"), precision="fp32", rounds=1, block=2, smoke=True, fed=True)
    assert {"expert_fed", "hotloop_fed"} <= set(row["step_ms"]) and "fed_vs_expert_fed" in row
    assert not multiprocessing.active_children()                    # the feeders are closed
