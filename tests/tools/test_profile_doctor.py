"""The speed doctor on a tiny model: every report section, HTML output, recommendations."""
from __future__ import annotations

import pytest
import torch

from hotloop.engine.strategy import Strategy
from hotloop.tools.hardware import HardwareInfo, GemmPeak
from hotloop.tools.profile import profile_training
from hotloop.tools.profile_advice import recommend
from hotloop.tools.profile_report import SECTIONS, SPLIT

pytestmark = pytest.mark.timeout(120)


def test_profile_reports_every_section(tiny_model, copy_problem, tiny_hp, tmp_path):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    rng = torch.get_rng_state()
    report = profile_training(tiny_model, copy_problem, tiny_hp, Strategy(sync_every=2), steps=4,
                              warmup=1, profiled_steps=2)
    text = report.text()
    for section in SECTIONS:
        assert f"== {section} ==" in text
        assert report.sections()[section]                       # no empty section
    split = report.split
    assert set(split) == set(SPLIT) and all(v >= 0 for v in split.values())
    assert split["forward"] > 0 and split["backward"] > 0 and split["optimizer"] > 0
    assert abs(sum(split.values()) - report.step_seconds) < 1e-9
    assert report.top_ops and all(ms >= 0 and calls > 0 for _, ms, calls in report.top_ops)
    assert report.syncs_per_step.get("sync", 0) == pytest.approx(0.5)   # 2 profiled steps, sync_every=2
    assert report.peak_memory[0] > 0 and 0 < report.mfu < 1
    assert report.flops_per_step > 0 and report.queue.capacity == 2
    html = report.write_html(tmp_path / "p.html").read_text()
    assert html.startswith("<!doctype html>") and "recommendations" in html and "<script" not in html
    import importlib.util
    if importlib.util.find_spec("matplotlib") is not None:
        assert report.write_png(tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(torch.equal(before[k], v) for k, v in tiny_model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_item_calls_in_the_model_are_counted_as_syncs(tiny_model, copy_problem, tiny_hp):
    original = type(tiny_model).forward

    def chatty(self, batch, state=None):
        logits, state = original(self, batch, state)
        float(logits.detach().sum())                                 # a host read-back inside forward
        return logits, state

    type(tiny_model).forward = chatty
    try:
        report = profile_training(tiny_model, copy_problem, tiny_hp, Strategy(sync_every=50), steps=2,
                                  warmup=1, profiled_steps=2)
    finally:
        type(tiny_model).forward = original
    assert report.syncs_per_step.get("forward", 0) >= 1
    assert any(r.setting == "model code" for r in report.recommendations)


def test_recommendations_name_the_setting_for_a_data_bound_fp32_matmul_step(tiny_model, copy_problem,
                                                                             tiny_hp):
    report = profile_training(tiny_model, copy_problem, tiny_hp, Strategy(prefetch=0, fused_optimizer=False),
                              steps=2, warmup=0, profiled_steps=1)
    # make the measured step data-bound and matmul-heavy, then ask the rules again
    report.phases = {"data_wait": 0.5, "forward": 0.2, "backward": 0.2, "optimizer": 0.1, "sync": 0.0}
    report.step_seconds = 1.0
    report.host_shares = {}
    report.facts = report.facts.__class__(**{**report.facts.__dict__, "flop_share": {"matmul": 1.0}})
    hw = HardwareInfo("cpu", 2, "t", ("avx512_bf16",))
    recs = {r.setting: r for r in recommend(report, hw, GemmPeak(1e11, 3e11, 512, 2))}
    assert recs["Strategy.prefetch"].value == "2"
    assert recs["Strategy.prefetch"].expected_gain == pytest.approx(0.5)
    assert recs["Strategy.precision"].value == "bf16" and 0 < recs["Strategy.precision"].expected_gain < 0.4
    assert "Strategy.fused_optimizer" not in recs or recs["Strategy.fused_optimizer"].value == "True"
