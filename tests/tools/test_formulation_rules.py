"""Formulation knobs: the Strategy owns them, the tuner proposes them by hardware, the ISA is capped
by the environment switches that make a newer CPU behave like an older one."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hotloop.engine.parity import FORMULATION_TOL, default_tolerance
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.models.formulation import POINTWISE_GEMM_OPTION, TAPS_OPTION, Formulation, FormulationOption
from hotloop.models.lstm_lm import WIDE_HIDDEN, LSTMLM, lstm_lm_small
from hotloop.problems.base import ProblemSpec
from hotloop.tools.hardware import HardwareInfo
from hotloop.tools.proposals import formulation_proposals

FAST = HardwareInfo("cpu", 2, "test cpu", ("avx512_bf16",), cpu_isa=("avx2", "avx512", "avx512_bf16"))
AVX2 = HardwareInfo("cpu", 2, "zen 3", (), cpu_isa=("avx2",))
SPEC = ProblemSpec("lm", 30, 30, streamed=True, pad_id=-1)


def _lstm(hidden: int) -> LSTMLM:
    return LSTMLM(lstm_lm_small().replace(hidden_size=hidden, max_length=4, batch_size=2), SPEC)


def test_hparams_sets_compute_plainly_and_the_lstm_offers_options_by_width() -> None:
    small, wide = _lstm(8), _lstm(WIDE_HIDDEN)
    assert small.formulation == Formulation()
    assert [o.label for o in small.formulation_options()] == ["fused_ce", "fused_ce bf16"]
    assert [o.label for o in wide.formulation_options()] == ["fused_ce", "fused_ce bf16", "bptt bf16"]


def test_bf16_formulations_are_proposed_only_where_bf16_is_fast() -> None:
    options = _lstm(WIDE_HIDDEN).formulation_options()
    fast = {p.label: p.changes for p in formulation_proposals(options, FAST)}
    # "fused_ce" is contained in "fused_ce bf16": the larger one's leave-one-out candidate covers it
    assert fast == {"fused_ce bf16": {"fused_ce": True, "ce_gemm_dtype": "bf16"},
                    "bptt bf16": {"lstm_impl": "bptt", "lstm_gemm_dtype": "bf16"}}
    plain = {p.label: p.changes for p in formulation_proposals(options, AVX2)}
    assert plain == {"fused_ce": {"fused_ce": True}}
    assert all(p.tags == ("lossy",) for p in formulation_proposals(options, FAST))


def test_random_stream_options_are_proposed_tagged_and_the_clip_fold_is_one_flag() -> None:
    masks = FormulationOption("bits16", {"dropout_masks": "bits16"}, "other draws", rounding="random_stream")
    [proposal] = formulation_proposals([masks], AVX2)
    assert proposal.changes == {"dropout_masks": "bits16"} and proposal.tags == ("random_stream",)
    [clip] = formulation_proposals([], AVX2, clip_foldable=True)
    assert clip.changes == {"clip_via_lr": True}


def test_an_option_is_timed_in_the_layout_it_names() -> None:
    [gemm] = formulation_proposals([POINTWISE_GEMM_OPTION], AVX2)
    assert gemm.changes == {"channels_last": True, "pointwise_conv": "gemm"}
    [taps] = formulation_proposals([TAPS_OPTION], AVX2)
    assert taps.changes == {"dilated_conv_wgrad": "taps"}


def test_strategy_checks_formulations_and_refuses_fields_a_model_does_not_read() -> None:
    with pytest.raises(StrategyError, match="ce_gemm_dtype=bf16 is an operand dtype .* set fused_ce=True"):
        Strategy(ce_gemm_dtype="bf16").validate()
    with pytest.raises(StrategyError, match="lstm_impl='cudnn'; choose one of"):
        Strategy(lstm_impl="cudnn").validate()
    with pytest.raises(StrategyError, match="Linear does not read this formulation field"):
        validate_for_model(Strategy(fused_ce=True), torch.nn.Linear(2, 2))
    validate_for_model(Strategy(fused_ce=True, ce_gemm_dtype="bf16"), _lstm(8))
    assert Strategy(fused_ce=True).formulation == Formulation(fused_ce=True)


def test_parity_tolerance_follows_the_formulation() -> None:
    assert default_tolerance(Strategy()) == 0.0
    assert default_tolerance(Strategy(fused_ce=True)) == FORMULATION_TOL
    assert default_tolerance(Strategy(clip_via_lr=True)) == FORMULATION_TOL
    assert default_tolerance(Strategy(fused_ce=True, ce_gemm_dtype="bf16")) == 3e-2


def _isa_in_child(env: dict[str, str]) -> dict:
    code = ("import json; from hotloop.ops.cpu_isa import cpu_isa; i = cpu_isa(); "
            "print(json.dumps({'hardware': i.hardware, 'usable': i.usable, 'caps': i.caps, 'fast': i.fast_bf16}))")
    clean = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_environment_caps_cap_the_usable_instruction_sets() -> None:
    native = _isa_in_child({})
    assert native["usable"] == native["hardware"] and native["caps"] == []
    capped = _isa_in_child({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    assert capped["hardware"] == native["hardware"]
    assert capped["usable"] == [n for n in native["hardware"] if n == "avx2"]
    assert capped["caps"] == ["ONEDNN_MAX_CPU_ISA=AVX2", "ATEN_CPU_CAPABILITY=avx2"] and not capped["fast"]
    core = _isa_in_child({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert "avx512_bf16" not in core["usable"] and not core["fast"]
