"""Every registered model trains identically under each strategy (K=3 steps vs eager fp32).

Every built-in model must have a case in ``hotloop.testing.CASES``: a missing
case, an import error or missing data fails here. Only models that a user (or
another test) registered at run time are skipped.
"""
import pytest
import torch

import hotloop  # noqa: F401 - declares the built-in registry names
from hotloop.engine import Strategy
from hotloop.engine.parity import check_parity
from hotloop.ops.cpu_isa import cpu_isa
from hotloop.registry import models
from hotloop.testing import CASES, MissingCaseError, builtin_model_names, model_case, models_without_case

STRATEGIES = {
    "eager_fused_opt": Strategy(fused_optimizer=True),
    "graph_serial_plain": Strategy(backend="graph", fused_optimizer=False),
    "graph_parallel_passes_inplace": Strategy(backend="graph", graph_passes=True, inplace=True,
                                              executor="parallel", fused_optimizer=True),
    "eager_bf16": Strategy(precision="bf16"),
}
#: bf16 capture (autocast inside the trace) is checked on the cheaper models only, to keep the suite fast
GRAPH_BF16 = Strategy(backend="graph", graph_passes=True, precision="bf16")
GRAPH_BF16_MODELS = ("mlp", "conv_net")


#: models whose bf16 step is not checked here: in three random-weight steps of yolov3 (objectness
#: summed over every cell) bf16 moves the losses by 9% and turns the Adam update's direction
#: (cosine -0.06 with eager's); its bf16 quality is compared over a run by benchmarks/zoo.py instead.
#: cyclegan, deeplabv3plus and mask_rcnn are checked: update size within 1.011, cosine >= 0.61
BF16_UNCHECKED = {"yolov3": "objectness summed over all cells"}

#: models whose captured fp32 graph is bitwise eager only on some CPUs: on the AMD EPYC with AVX-512
#: (Zen 4) it is; with AVX2 (a Zen 3 CPU, or ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2) the
#: captured graph's reductions split differently and yolov3's first loss moved by 1.9e-6 (8e-8
#: relative), and on an Intel Xeon with AVX-512 and AMX its second loss moved by 3.8e-6 (1.8e-7
#: relative) while its parameters and buffers stayed bitwise eager's over six steps (only the loss
#: scalar's own sum rounds otherwise); the relative tolerance that applies off the Zen 4 machine,
#: with the engine's update check
ISA_ROUNDING = {"yolov3": 1e-6}
GRAPH_EXACT_CPU = "avx512" in cpu_isa().usable and "AMD" in cpu_isa().model

#: models whose graph capture is known to fall back, and the reason's key phrase
KNOWN_FALLBACKS = {"lstm_seq2seq": "mkldnn_rnn_layer",
                   "mask_rcnn": "data-dependent",          # proposals and sampled RoIs have data-dependent counts
                   "cyclegan": "phases runs eagerly"}      # a step program (generator, discriminator) is eager


def _build(name):
    if name not in builtin_model_names() and name not in CASES:
        pytest.skip(f"{name!r} is registered by a user, not built in: no case to run")
    return model_case(name, "tiny", steps=3)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", models.names())
def test_every_strategy_matches_eager_fp32(name):
    build = _build(name)
    failures = []
    strategies = dict(STRATEGIES)
    if name in BF16_UNCHECKED:
        del strategies["eager_bf16"]
    if name in GRAPH_BF16_MODELS:
        strategies["graph_bf16_passes"] = GRAPH_BF16
    for label, strategy in strategies.items():
        tol = ISA_ROUNDING.get(name) if strategy.backend == "graph" and not GRAPH_EXACT_CPU else None
        result = check_parity(build, strategy, steps=3, tol=tol)
        exact = strategy.precision == "fp32" and tol is None
        if not result.ok or (exact and result.max_abs_diff != 0.0):
            failures.append(f"{label}: diff {result.max_abs_diff} losses {result.losses} "
                            f"vs {result.losses_ref} ({result.fallback_reason})")
        if strategy.backend == "graph":
            expected = KNOWN_FALLBACKS.get(name)
            reason = result.fallback_reason or ""
            if expected is None and reason:
                failures.append(f"{label}: unexpected fallback: {reason}")
            elif expected is not None and expected not in reason:
                failures.append(f"{label}: expected fallback {expected!r}, got {reason!r}")
        if exact:
            assert result.tol == 0.0
        elif tol is not None:
            assert result.tol == tol
        else:
            assert result.tol > 0 and result.max_abs_diff > 0.0, f"{label}: bf16 had no effect"
    assert not failures, "\n".join(failures)


def test_every_builtin_model_has_a_case():
    assert not models_without_case(), (
        f"built-in models without a case in hotloop.testing.CASES: {models_without_case()}")
    for name in ("transformer", "mlp", "lstm_seq2seq", "conv_net", "lstm_lm"):
        assert name in builtin_model_names()


def test_a_model_without_a_case_is_an_error_not_a_skip():
    with pytest.raises(MissingCaseError, match="no case"):
        model_case("no_such_model_here", "tiny")
    with pytest.raises(ValueError, match="size"):
        model_case("mlp", "huge")


def test_lstm_seq2seq_nn_lstm_falls_back_with_reason():
    result = check_parity(model_case("lstm_seq2seq", "tiny", steps=1), Strategy(backend="graph"), steps=1)
    assert result.ok and "mkldnn_rnn_layer" in (result.fallback_reason or "")


def test_parity_detects_a_difference():
    build = model_case("mlp", "tiny", steps=2)

    calls = []

    def perturbed():                       # the second build (the strategy's) differs by 1e-6
        case = build()
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                next(case.model.parameters()).add_(1e-6)
        return case
    result = check_parity(perturbed, Strategy(), steps=2)
    assert not result.ok and result.max_abs_diff > 0


@pytest.mark.timeout(180)
def test_nn_lstm_captures_with_onednn_off_and_matches_bitwise():
    build = model_case("lstm_lm", "tiny", steps=2, formulation="lstm_impl=fused")
    with torch.backends.mkldnn.flags(enabled=False):        # what apply_device_flags(onednn=False) sets
        result = check_parity(build, Strategy(backend="graph", graph_passes=True, onednn=False), steps=2)
    assert result.fallback_reason is None, result.fallback_reason
    assert result.ok and result.max_abs_diff == 0.0
