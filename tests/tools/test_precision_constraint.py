"""``allow_reduced_precision=False`` (``benchmarks/zoo.py --precision fp32``): on hardware with fast
bf16 (and TF32 on the GPU) the tuner proposes, times and chooses nothing below fp32."""
from __future__ import annotations

import pytest

from hotloop.engine.strategy import Strategy
from hotloop.models.formulation import FormulationOption
from hotloop.tools.autotune import tune
from hotloop.tools.hardware import HardwareInfo
from hotloop.tools.model_facts import ModelFacts
from hotloop.tools.proposals import Proposal, baseline_strategy, formulation_proposals, propose, reduced_precision

pytestmark = pytest.mark.timeout(120)

FAST_CPU = HardwareInfo("cpu", 2, "test cpu", ("avx512_bf16",), cpu_isa=("avx2", "avx512", "avx512_bf16"))
AMPERE = HardwareInfo("cuda", 8, "host", (), "A100", (8, 0))
MATMUL_HEAVY = ModelFacts("m.M", 1000, {"linear": 4}, 0, False, 1e10, 100, {"matmul": 0.9, "other": 0.1})
#: the LSTM LM's options: the fp32 fused CE is a subset of the bf16 one (pruned when both fit)
LSTM_OPTIONS = [
    FormulationOption("fused_ce", {"fused_ce": True}, "fused CE"),
    FormulationOption("fused_ce bf16", {"fused_ce": True, "ce_gemm_dtype": "bf16"}, "fused CE, bf16 GEMMs",
                      rounding="bf16", needs_fast_bf16=True),
    FormulationOption("bptt bf16", {"lstm_impl": "bptt", "lstm_gemm_dtype": "bf16"}, "bptt, bf16 GEMMs",
                      rounding="bf16", needs_fast_bf16=True)]


def _reduced(proposals: list[Proposal]) -> list[str]:
    return [p.label for p in proposals if reduced_precision(p.apply(baseline_strategy()))]


def test_reduced_precision_names_bf16_tf32_and_bf16_gemm_formulations():
    assert not reduced_precision(Strategy())
    assert not reduced_precision(Strategy(fused_ce=True, channels_last=True, fused_optimizer=True))
    for changes in ({"precision": "bf16"}, {"precision": "fp16"}, {"tf32": True},
                    {"fused_ce": True, "ce_gemm_dtype": "bf16"}, {"lstm_impl": "bptt", "lstm_gemm_dtype": "bf16"}):
        assert reduced_precision(Strategy(**changes)), changes


@pytest.mark.parametrize("hw", [FAST_CPU, AMPERE], ids=["avx512_bf16", "ampere"])
def test_fp32_only_proposes_nothing_below_fp32(hw):
    allowed = propose(MATMUL_HEAVY, hw, formulations=LSTM_OPTIONS)
    assert _reduced(allowed), "the fake hardware must make the rules propose reduced precision"
    held = propose(MATMUL_HEAVY, hw, formulations=LSTM_OPTIONS, allow_reduced_precision=False)
    assert _reduced(held) == []
    assert "fused_optimizer" in {p.label for p in held}          # the fp32 levers stay


def test_fp32_only_keeps_the_fp32_subset_of_a_bf16_formulation():
    """With both options fitting, only the bf16 superset is proposed; held at fp32, the fp32 one is."""
    assert "fused_ce" not in {p.label for p in formulation_proposals(LSTM_OPTIONS, FAST_CPU)}
    held = formulation_proposals(LSTM_OPTIONS, FAST_CPU, allow_reduced_precision=False)
    assert [p.label for p in held] == ["fused_ce"]


def test_tuner_held_at_fp32_times_and_chooses_fp32_only(tiny_model, copy_problem, tiny_hp):
    """End to end on fake fast-bf16 hardware: every candidate the tuner lines up (and the caller's
    extra proposal) is fp32 with fp32 GEMM operands, and so is the choice."""
    extra = [Proposal("mine bf16", {"precision": "bf16"}, "caller's"), Proposal("mine", {"inplace": True}, "caller's")]
    options = dict(max_seconds=1.0, cache=False, log=lambda line: None, num_batches=2, hardware=FAST_CPU,
                   extra_proposals=extra)       # a budget that lines candidates up (a 0 s one skips tuning)
    free = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, **options)
    assert any(t.strategy.precision == "bf16" for t in free.trials)     # the hardware invites bf16
    held = tune(tiny_model, copy_problem, tiny_hp, "cpu", None, allow_reduced_precision=False, **options)
    assert "mine" in {t.label for t in held.trials}
    for trial in held.trials + [held]:
        strategy = trial.strategy
        assert strategy.precision == "fp32" and not strategy.tf32, trial
        assert (strategy.ce_gemm_dtype, strategy.lstm_gemm_dtype) == ("fp32", "fp32"), trial
    assert any("fp32 only" in note for note in held.notes)
