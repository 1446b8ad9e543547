"""lstm_lm with bits16 dropout masks: the per-layer nn.LSTM kernel path, masks everywhere, training."""
from __future__ import annotations

import pytest
import torch

from helpers import repeating_stream_losses
from hotloop.engine.build import build_step
from hotloop.engine.strategy import Strategy, StrategyError
from hotloop.models import lstm_cells
from hotloop.models.lstm_lm import LSTMLM, lstm_lm_small
from hotloop.ops.cpu_isa import CpuIsa, cpu_isa
from hotloop.problems.base import ProblemSpec

VOCAB = 41
SPEC = ProblemSpec("lm", VOCAB, VOCAB, streamed=True, pad_id=-1)


BITS16 = Strategy(dropout_masks="bits16")


def _hp(**changes):
    base = dict(hidden_size=16, max_length=7, batch_size=4, init_scale=0.3, dropout=0.3)
    base.update(changes)
    return lstm_lm_small().replace(**base)


def _model(hp, **formulation) -> LSTMLM:
    model = LSTMLM(hp, SPEC)
    model.use_formulation(BITS16.replace(**formulation).formulation)
    return model


#: oneDNN has a bf16 LSTM only with usable AVX512-BF16 or AMX
NO_BF16_LSTM = not cpu_isa().fast_bf16


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_layer_by_layer_kernel_is_bitwise_nn_lstm(precision: str) -> None:
    if precision == "bf16" and NO_BF16_LSTM:
        pytest.skip("this CPU has no bf16 LSTM (test_fused_lstm_runs_fp32_under_bf16_autocast covers it)")
    torch.manual_seed(0)
    rnn = torch.nn.LSTM(16, 16, 3)
    x = torch.randn(7, 4, 16, requires_grad=True)
    state = (torch.randn(3, 4, 16), torch.randn(3, 4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        ref_y, (ref_h, ref_c) = rnn(x, state)
        y, (h, c) = lstm_cells._stack(lstm_cells._fused_layer, rnn, x, state, 0.0, True)
    assert torch.equal(y, ref_y) and torch.equal(h, ref_h) and torch.equal(c, ref_c)
    grad = torch.randn_like(y)
    ref_grads = torch.autograd.grad(ref_y, [x, *rnn.parameters()], grad)
    grads = torch.autograd.grad(y, [x, *rnn.parameters()], grad)
    for a, b in zip(grads, ref_grads):
        assert torch.equal(a, b)


def test_fused_lstm_runs_fp32_under_bf16_autocast_where_onednn_has_no_bf16_lstm(monkeypatch) -> None:
    """Without a bf16 LSTM kernel (forced here on any CPU), nn.LSTM and its layer-by-layer path
    run in fp32 inside bf16 autocast: bitwise the fp32 result, never oneDNN's error."""
    monkeypatch.setattr(lstm_cells, "cpu_isa", lambda: CpuIsa("test", ("avx2",), ("avx2",), ()))
    torch.manual_seed(0)
    rnn = torch.nn.LSTM(16, 16, 3)
    x = torch.randn(7, 4, 16)
    state = (torch.randn(3, 4, 16), torch.randn(3, 4, 16))
    for masks, dropout in (("bernoulli", 0.0), ("bits16", 0.3)):      # nn.LSTM whole, and layer by layer
        torch.manual_seed(1)
        ref_y, (ref_h, ref_c) = lstm_cells._fused(rnn, x, state, dropout, True, masks=masks)
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert lstm_cells.bf16_lstm_unavailable(x) is not None
            y, (h, c) = lstm_cells._fused(rnn, x, state, dropout, True, masks=masks)
        assert y.dtype == torch.float32
        assert torch.equal(y, ref_y) and torch.equal(h, ref_h) and torch.equal(c, ref_c)


def test_bf16_on_a_cpu_without_fast_bf16_trains_with_notices(monkeypatch) -> None:
    from hotloop.engine import precision_notices
    slow = CpuIsa("test", ("avx2",), ("avx2",), ())
    monkeypatch.setattr(lstm_cells, "cpu_isa", lambda: slow)
    monkeypatch.setattr(precision_notices, "cpu_isa", lambda: slow)
    torch.manual_seed(0)
    hp = _hp(learning_rate=1.0, max_grad_norm=5.0, dropout=0.0)
    step = build_step(LSTMLM(hp, SPEC), hp, Strategy(precision="bf16")).step
    assert len(step.notices) == 2
    assert step.notices[0].startswith("precision=bf16 on a CPU without fast bf16 (usable ISA avx2)")
    assert "x the time of fp32 here" in step.notices[0]
    assert "nn.LSTM runs in fp32" in step.notices[1]
    losses = repeating_stream_losses(step, rows=4, window=7)
    assert all(torch.isfinite(torch.tensor(losses)))
    fast = CpuIsa("test", ("avx2", "avx512", "avx512_bf16"), ("avx2", "avx512", "avx512_bf16"), ())
    monkeypatch.setattr(precision_notices, "cpu_isa", lambda: fast)
    assert build_step(LSTMLM(hp, SPEC), hp, Strategy(precision="bf16")).step.notices == []


@pytest.mark.parametrize("impl", ["fused", "bptt"])
def test_bits16_masks_drop_at_every_site_and_only_while_training(impl: str, monkeypatch) -> None:
    from hotloop.ops import dropout as dropout_module
    calls = []
    real = dropout_module.dropout_mask
    monkeypatch.setattr(dropout_module, "dropout_mask", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    torch.manual_seed(0)
    model = _model(_hp(), lstm_impl=impl)
    batch = {"inputs": torch.randint(0, VOCAB, (4, 7)), "targets": torch.randint(0, VOCAB, (4, 7))}
    model.loss(batch)
    assert calls == [torch.Size([7, 4, 16])] * 3           # embedding, between the 2 layers, output
    model.eval()
    calls.clear()
    first = model.loss(batch).loss
    assert calls == [] and torch.equal(model.loss(batch).loss, first)


def test_training_with_bits16_masks_lowers_loss_and_unknown_masks_are_refused() -> None:
    torch.manual_seed(0)
    hp = _hp(hidden_size=32, learning_rate=1.0, max_grad_norm=5.0, dropout=0.2)
    model = LSTMLM(hp, SPEC)
    step = build_step(model, hp, BITS16.replace(clip_via_lr=True)).step
    assert "clip: folded into the SGD learning rate" in step.report
    assert "formulation: dropout_masks=bits16" in step.report
    losses = repeating_stream_losses(step, rows=4, window=7)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    with pytest.raises(StrategyError, match="dropout_masks='coin'; choose one of"):
        Strategy(dropout_masks="coin").validate()
