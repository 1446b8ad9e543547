"""The speed doctor on a tiny model: every report section, HTML output, recommendations."""
from __future__ import annotations

import statistics
import time

import pytest
import torch

from hotloop.engine.strategy import Strategy
from hotloop.tools.hardware import HardwareInfo, GemmPeak
from hotloop.tools.profile import _Feed, _Stepper, profile_training
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
    # the compute phases (medians, from the hook inside the step) fit in the whole step call
    compute = sum(report.phases[p] for p in ("forward", "backward", "forward_backward", "optimizer"))
    call = report.step_seconds - report.phases["data_wait"] - report.phases["sync"]
    # (medians of 4 steps each, so a loose bound; the per-iteration test below is exact)
    assert report.phases["step_other"] >= 0 and 0.5 * call <= compute <= call * 1.25
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


def test_phases_timed_inside_the_step_add_up_to_the_independently_timed_step(tiny_model, copy_problem,
                                                                            tiny_hp):
    """Each iteration: the step call is timed as a whole around ``step(...)``, the phases by the
    hook inside it. The phases lie inside the call, and cover nearly all of it (the rest is the
    step's own bookkeeping); an outer clock around the whole iteration bounds both."""
    strategy = Strategy(sync_every=2)
    device = torch.device("cpu")
    feed = _Feed(copy_problem, tiny_hp, strategy, device)
    try:
        stepper = _Stepper(tiny_model, tiny_hp, strategy, device)
        coverage = []
        for _ in range(12):
            start = time.perf_counter()
            times = stepper.run(feed)
            outer = time.perf_counter() - start
            phases = sum(times[p] for p in ("forward", "backward", "forward_backward", "optimizer"))
            assert times["forward"] > 0 and times["backward"] > 0 and times["optimizer"] > 0
            assert phases <= times["step"]                            # inside the call
            assert times["step"] + times["data_wait"] + times["sync"] <= outer
            coverage.append(phases / times["step"])
    finally:
        feed.close()
    assert statistics.median(coverage) > 0.7, coverage                 # the hook sees most of the step


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


def test_a_conv_heavy_fp32_step_is_advised_bf16_and_channels_last(tiny_model, copy_problem, tiny_hp):
    report = profile_training(tiny_model, copy_problem, tiny_hp, Strategy(prefetch=0, fused_optimizer=False),
                              steps=2, warmup=0, profiled_steps=1)
    report.phases = {"data_wait": 0.0, "forward": 0.4, "backward": 0.5, "optimizer": 0.1, "sync": 0.0}
    report.step_seconds = 1.0
    report.host_shares = {}
    report.facts = report.facts.__class__(**{**report.facts.__dict__, "has_conv2d": True,
                                             "flop_share": {"conv": 0.8, "matmul": 0.1, "other": 0.1}})
    hw = HardwareInfo("cpu", 2, "t", ("avx512_bf16",))
    recs = {r.setting: r for r in recommend(report, hw, GemmPeak(1e11, 3e11, 512, 2))}
    assert recs["Strategy.precision"].value == "bf16" and "convolutions" in recs["Strategy.precision"].reason
    assert recs["Strategy.precision"].expected_gain == pytest.approx(0.9 * 0.9 * (1 - 1 / 3))
    assert recs["Strategy.channels_last"].value == "True"
    no_bf16 = {r.setting for r in recommend(report, HardwareInfo("cpu", 2, "t", ()), GemmPeak(1e11, 3e11, 512, 2))}
    assert "Strategy.precision" not in no_bf16


def test_the_cpu_gemm_peak_is_the_faster_of_the_blas_and_onednn(monkeypatch) -> None:
    import hotloop.tools.hardware as hardware
    timed = []

    def fake_flops(product, n, device, seconds):  # noqa: ANN001
        out = product()
        timed.append(out)
        return [3e11, 5e11][len(timed) - 1]
    monkeypatch.setattr(hardware, "_flops", fake_flops)
    assert hardware._time_matmul(8, torch.float32, torch.device("cpu"), 0.0) == 5e11   # oneDNN's, the faster here
    torch.testing.assert_close(timed[1], timed[0], rtol=1e-5, atol=1e-5)               # the same product both ways
