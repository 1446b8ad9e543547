"""Tuning and profiling leave every process-wide backend flag as the caller set it."""
from __future__ import annotations

import pytest
import torch

from hotloop.engine.strategy import Strategy
from hotloop.tools.autotune import tune
from hotloop.tools.isolation import applied_strategy, backend_flags, preserved_process_state
from hotloop.tools.profile import profile_training

pytestmark = pytest.mark.timeout(120)

#: a value for each flag that differs from torch's default, set by hand
CHANGES = {
    "threads": lambda: torch.set_num_threads(3 if torch.get_num_threads() != 3 else 2),
    "onednn": lambda: setattr(torch.backends.mkldnn, "enabled", not torch.backends.mkldnn.enabled),
    "cudnn_enabled": lambda: setattr(torch.backends.cudnn, "enabled", not torch.backends.cudnn.enabled),
    "cudnn_benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark),
    "cudnn_deterministic": lambda: setattr(torch.backends.cudnn, "deterministic",
                                           not torch.backends.cudnn.deterministic),
    "matmul_precision": lambda: torch.set_float32_matmul_precision(
        "medium" if torch.get_float32_matmul_precision() != "medium" else "highest"),
}


@pytest.fixture
def caller_flags():
    """Unusual caller settings (oneDNN off, cudnn.benchmark on, medium matmul precision); put back after."""
    saved = backend_flags()
    torch.backends.mkldnn.enabled = False
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("medium")
    yield backend_flags()
    torch.backends.mkldnn.enabled = saved["onednn"]
    torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
    torch.set_float32_matmul_precision(saved["matmul_precision"])


@pytest.mark.parametrize("flag", sorted(CHANGES))
def test_each_flag_changed_inside_is_restored(flag):
    before = backend_flags()
    with preserved_process_state():
        CHANGES[flag]()
        assert backend_flags()[flag] != before[flag]          # the change really happened
    assert backend_flags() == before


def test_applied_strategy_sets_onednn_for_the_block_only(caller_flags):
    with applied_strategy(Strategy(onednn=True), torch.device("cpu")):
        assert torch.backends.mkldnn.enabled is True
    assert backend_flags() == caller_flags


def _recording(model):
    """Record torch.backends.mkldnn.enabled at every loss call of ``model``'s copies."""
    seen: list[bool] = []
    original = type(model).loss

    def loss(self, *args, **kwargs):
        seen.append(torch.backends.mkldnn.enabled)
        return original(self, *args, **kwargs)
    return seen, original, loss


def test_tune_and_profile_restore_the_callers_flags(caller_flags, tiny_model, copy_problem, tiny_hp):
    seen, original, loss = _recording(tiny_model)
    type(tiny_model).loss = loss
    try:
        tune(tiny_model, copy_problem, tiny_hp, "cpu", None, max_seconds=2, cache=False,
             log=lambda line: None, max_trial_steps=2, num_batches=4)
        assert True in seen                  # the trials ran with oneDNN on (Strategy.onednn=True) ...
        assert backend_flags() == caller_flags        # ... and the caller's oneDNN-off came back
        seen.clear()
        profile_training(tiny_model, copy_problem, tiny_hp, Strategy(onednn=True), steps=1, warmup=0,
                         profiled_steps=1)
        assert True in seen
        assert backend_flags() == caller_flags
    finally:
        type(tiny_model).loss = original
