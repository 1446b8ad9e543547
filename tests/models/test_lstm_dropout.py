"""lstm_lm with bits16 dropout masks: the per-layer nn.LSTM kernel path, masks everywhere, training."""
from __future__ import annotations

import pytest
import torch

from helpers import repeating_stream_losses
from hotloop.engine.step import build_step
from hotloop.engine.strategy import Strategy
from hotloop.models import lstm_cells
from hotloop.models.lstm_lm import LSTMLM, lstm_lm_small
from hotloop.ops.dropout import DropoutMaskError
from hotloop.problems.base import ProblemSpec

VOCAB = 41
SPEC = ProblemSpec("lm", VOCAB, VOCAB, streamed=True, pad_id=-1)


def _hp(**changes):
    base = dict(hidden_size=16, max_length=7, batch_size=4, init_scale=0.3, ce_gemm_dtype="fp32",
                dropout=0.3, dropout_masks="bits16")
    base.update(changes)
    return lstm_lm_small().replace(**base)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_layer_by_layer_kernel_is_bitwise_nn_lstm(precision: str) -> None:
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


@pytest.mark.parametrize("impl", ["fused", "bptt"])
def test_bits16_masks_drop_at_every_site_and_only_while_training(impl: str, monkeypatch) -> None:
    from hotloop.ops import dropout as dropout_module
    calls = []
    real = dropout_module.dropout_mask
    monkeypatch.setattr(dropout_module, "dropout_mask", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    torch.manual_seed(0)
    model = LSTMLM(_hp(lstm_impl=impl), SPEC)
    batch = {"inputs": torch.randint(0, VOCAB, (4, 7)), "targets": torch.randint(0, VOCAB, (4, 7))}
    model.loss(batch)
    assert calls == [torch.Size([7, 4, 16])] * 3           # embedding, between the 2 layers, output
    model.eval()
    calls.clear()
    first = model.loss(batch).loss
    assert calls == [] and torch.equal(model.loss(batch).loss, first)


def test_training_with_bits16_masks_lowers_loss_and_unknown_masks_are_refused() -> None:
    torch.manual_seed(0)
    hp = _hp(hidden_size=32, learning_rate=1.0, max_grad_norm=5.0, dropout=0.2, clip_via_lr=True)
    model = LSTMLM(hp, SPEC)
    step = build_step(model, hp, Strategy()).step
    assert "clip: folded into the SGD learning rate" in step.report
    losses = repeating_stream_losses(step, rows=4, window=7)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    with pytest.raises(DropoutMaskError, match="unknown dropout_masks 'coin'"):
        LSTMLM(_hp(dropout_masks="coin"), SPEC)
