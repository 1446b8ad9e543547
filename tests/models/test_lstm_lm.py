"""lstm_lm: formulation equivalence, fused cross-entropy, state carry, hparams sets, training."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import repeating_stream_losses
from hotloop.builtin import declare_builtins
from hotloop.engine.build import compile_step
from hotloop.engine.strategy import Strategy
from hotloop.hparams import get_hparams
from hotloop.models.base import ModelMismatchError
from hotloop.models.fused_ce import linear_cross_entropy
from hotloop.models.formulation import FORMULATION_FIELDS, Formulation, FormulationError
from hotloop.models.lstm_cells import LSTM_IMPLS
from hotloop.models.lstm_lm import LSTMLM, lstm_lm_small
from hotloop.optim import build_optimizer
from hotloop.problems.base import ProblemSpec
from hotloop.registry import hparams_sets, models

VOCAB = 37
SPEC = ProblemSpec("lm", VOCAB, VOCAB, streamed=True, pad_id=-1)


def tiny_hp(**changes):
    base = dict(hidden_size=12, max_length=6, batch_size=3, init_scale=0.3)
    base.update(changes)
    return lstm_lm_small().replace(**base)


def lstm(**changes) -> LSTMLM:
    """A tiny LSTMLM: hparams fields and Strategy formulation fields (chunks of 5 rows) in one call."""
    form = {k: changes.pop(k) for k in list(changes) if k in FORMULATION_FIELDS}
    model = LSTMLM(tiny_hp(**changes), SPEC)
    model.use_formulation(Formulation(**{"ce_chunk_rows": 5, **form}))
    return model


def make_batch(seed: int = 0, batch: int = 3, steps: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, steps + 1), generator=g)
    return {"inputs": ids[:, :-1], "targets": ids[:, 1:]}


def loss_and_grads(model: LSTMLM, batch, state):
    model.zero_grad(set_to_none=True)
    out = model.loss(batch, state)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out, grads


def reference_model(**changes) -> LSTMLM:
    torch.manual_seed(0)
    return lstm(**{"lstm_impl": "fused", "fused_ce": False, **changes})


@pytest.mark.parametrize("impl", sorted(LSTM_IMPLS))
@pytest.mark.parametrize("fused_ce", [False, True])
def test_formulations_match_fused_reference(impl: str, fused_ce: bool) -> None:
    ref = reference_model()
    batch = make_batch()
    state = tuple(s + 0.1 * torch.randn_like(s) for s in ref.initial_state(3, torch.device("cpu")))
    ref_out, ref_grads = loss_and_grads(ref, batch, state)
    model = lstm(lstm_impl=impl, fused_ce=fused_ce)
    # identical parameter names and shapes: checkpoints interchange
    assert {n: p.shape for n, p in model.named_parameters()} == \
           {n: p.shape for n, p in ref.named_parameters()}
    model.load_state_dict(ref.state_dict())
    out, grads = loss_and_grads(model, batch, state)
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.stats["nll_sum"], ref_out.stats["nll_sum"], rtol=1e-5, atol=1e-5)
    assert int(out.stats["tokens"]) == 18 and int(out.stats["examples"]) == 3
    for h_new, h_ref in zip(out.state, ref_out.state):
        torch.testing.assert_close(h_new, h_ref, rtol=1e-5, atol=1e-6)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_forward_logits_match_between_impls() -> None:
    ref = reference_model()
    batch = make_batch(1)
    logits, _ = ref(batch)
    assert logits.shape == (3, 6, VOCAB)
    for impl in LSTM_IMPLS:
        other = lstm(lstm_impl=impl)
        other.load_state_dict(ref.state_dict())
        torch.testing.assert_close(other(batch)[0], logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk_rows", [1, 4, 7, 64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_cross_entropy_matches_log_softmax_nll(chunk_rows: int, with_bias: bool) -> None:
    torch.manual_seed(3)
    n, h, v = 19, 8, 23
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    bias = torch.randn(v, requires_grad=True) if with_bias else None
    targets = torch.randint(0, v, (n,))
    got = linear_cross_entropy(hidden, weight, bias, targets, chunk_rows=chunk_rows)
    (got * 0.37).backward()
    got_grads = [t.grad.clone() for t in (hidden, weight, bias) if t is not None]
    for t in (hidden, weight, bias):
        if t is not None:
            t.grad = None
    logits = F.linear(hidden, weight, bias)
    want = F.nll_loss(F.log_softmax(logits, dim=-1), targets, reduction="sum")
    (want * 0.37).backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, t in zip(got_grads, [t for t in (hidden, weight, bias) if t is not None]):
        torch.testing.assert_close(g, t.grad, rtol=1e-5, atol=1e-6)


def test_fused_cross_entropy_bf16_gemms_within_bf16_tolerance() -> None:
    torch.manual_seed(5)
    hidden = torch.randn(300, 32, requires_grad=True)
    weight = (0.1 * torch.randn(500, 32)).requires_grad_()
    bias = torch.zeros(500, requires_grad=True)
    targets = torch.randint(0, 500, (300,))
    grads = []
    losses = []
    for dtype in (None, torch.bfloat16):
        for t in (hidden, weight, bias):
            t.grad = None
        loss = linear_cross_entropy(hidden, weight, bias, targets, chunk_rows=128, gemm_dtype=dtype)
        loss.backward()
        losses.append(loss.detach())
        grads.append([t.grad.clone() for t in (hidden, weight, bias)])
    assert losses[1].dtype == torch.float32
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-3, atol=0)
    for low, full in zip(grads[1], grads[0]):
        rel = (low - full).norm() / full.norm()
        assert rel < 1e-2, rel
    assert not torch.equal(grads[1][1], grads[0][1])  # really ran in bf16


def test_bf16_ce_is_training_only() -> None:
    ref = reference_model(fused_ce=True)
    low = lstm(fused_ce=True, ce_gemm_dtype="bf16")
    low.load_state_dict(ref.state_dict())
    batch = make_batch(6)
    ref.eval()
    low.eval()
    with torch.no_grad():
        assert torch.equal(low.loss(batch).stats["nll_sum"], ref.loss(batch).stats["nll_sum"])
    ref.train()
    low.train()
    with torch.no_grad():
        a, b = low.loss(batch).stats["nll_sum"], ref.loss(batch).stats["nll_sum"]
    assert not torch.equal(a, b) and torch.allclose(a, b, rtol=5e-3)


def test_bptt_bf16_gemms_within_bf16_tolerance_and_training_only() -> None:
    ref = reference_model(hidden_size=64)
    low = lstm(hidden_size=64, lstm_impl="bptt", lstm_gemm_dtype="bf16", fused_ce=False)
    low.load_state_dict(ref.state_dict())
    batch = make_batch(7, steps=6)
    ref_out, ref_grads = loss_and_grads(ref, batch, None)
    out, grads = loss_and_grads(low, batch, None)
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=2e-3, atol=0)
    for name, grad in ref_grads.items():
        rel = (grads[name] - grad).norm() / grad.norm()
        assert rel < 2e-2, (name, rel)
    assert not torch.equal(grads["rnn.weight_hh_l0"], ref_grads["rnn.weight_hh_l0"])  # really bf16
    ref.eval()
    low.eval()
    with torch.no_grad():   # evaluation runs the fp32 GEMMs: identical up to summation order
        torch.testing.assert_close(low.loss(batch).stats["nll_sum"], ref.loss(batch).stats["nll_sum"],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gemm_dtype, rtol", [(None, 1e-5), (torch.bfloat16, 1e-2)])
def test_fused_cross_entropy_ignores_pad_rows(gemm_dtype, rtol) -> None:
    torch.manual_seed(4)
    hidden = torch.randn(10, 5, requires_grad=True)
    weight = (0.3 * torch.randn(11, 5)).requires_grad_()
    bias = torch.zeros(11, requires_grad=True)
    targets = torch.randint(1, 11, (10,))
    targets[[2, 7]] = 0
    got = linear_cross_entropy(hidden, weight, bias, targets, ignore_index=0, chunk_rows=3,
                               gemm_dtype=gemm_dtype)
    got.backward()
    want = F.cross_entropy(hidden.detach() @ weight.detach().t(), targets, ignore_index=0, reduction="sum")
    torch.testing.assert_close(got, want, rtol=rtol, atol=1e-5 if gemm_dtype is None else 0.0)
    assert torch.all(hidden.grad[[2, 7]] == 0) and hidden.grad[0].abs().sum() > 0
    assert torch.isfinite(weight.grad).all() and bias.grad.abs().sum() > 0


def test_fused_cross_entropy_never_allocates_full_logits(monkeypatch) -> None:
    """Every GEMM output inside the fused loss has at most ``chunk_rows`` rows."""
    import hotloop.models.fused_ce as fused_ce
    rows_seen: list[int] = []
    real_addmm, real_mm = torch.addmm, torch.mm

    class Spy:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def addmm(bias, a, b, **kw):
            rows_seen.append(a.shape[0])
            return real_addmm(bias, a, b, **kw)

        @staticmethod
        def mm(a, b, **kw):
            rows_seen.append(a.shape[0])
            return real_mm(a, b, **kw)

    monkeypatch.setattr(fused_ce, "torch", Spy())
    hidden = torch.randn(50, 4, requires_grad=True)
    weight = torch.randn(9, 4, requires_grad=True)
    bias = torch.zeros(9, requires_grad=True)
    fused_ce.linear_cross_entropy(hidden, weight, bias, torch.randint(0, 9, (50,)), chunk_rows=8).backward()
    assert rows_seen and max(rows_seen) <= 8 and len(rows_seen) >= 2 * math.ceil(50 / 8)


def test_fused_cross_entropy_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="hidden must be"):
        linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), None, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), None, torch.zeros(4, dtype=torch.long),
                             chunk_rows=0)


def test_state_is_carried_and_detached_across_batches() -> None:
    model = reference_model(fused_ce=True)
    opt = build_optimizer(model.parameters(), model.hp, fused=True)
    step = compile_step(model, None, opt, Strategy(), max_grad_norm=5.0)
    whole = make_batch(5, steps=12)
    first = {k: v[:, :6] for k, v in whole.items()}
    second = {k: v[:, 6:] for k, v in whole.items()}
    state0 = model.initial_state(3, torch.device("cpu"))
    assert all(s.shape == (2, 3, 12) and torch.all(s == 0) for s in state0)
    # the carried state equals the state after running both windows as one sequence
    with torch.no_grad():
        _, state_whole = model(whole, state0)
        _, mid = model(first, state0)
        _, state_two = model(second, mid)
    for a, b in zip(state_two, state_whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    result = step([first], state0)
    assert all(not s.requires_grad and s.grad_fn is None for s in result.state)
    assert not torch.all(result.state[0] == 0)
    result2 = step([second], result.state)   # backward must not reach into the first batch
    assert torch.isfinite(result2.loss)


def test_loss_is_sum_over_time_mean_over_batch() -> None:
    model = reference_model(fused_ce=True)
    batch = make_batch(2)
    out = model.loss(batch)
    torch.testing.assert_close(out.loss, out.stats["nll_sum"] / 3)
    mean_model = lstm(loss_sum_over_time=False)
    mean_model.load_state_dict(model.state_dict())
    torch.testing.assert_close(mean_model.loss(batch).loss, out.stats["nll_sum"] / 18)


def test_paper_hparams() -> None:
    declare_builtins()
    small, medium, large = (get_hparams(f"lstm_lm_{n}") for n in ("small", "medium", "large"))
    expected = {  # Zaremba, Sutskever & Vinyals 2014, Section 4.1
        small: (200, 20, 0.1, 4, 13, 0.5, 0.0, 5.0),
        medium: (650, 35, 0.05, 6, 39, 0.8, 0.5, 5.0),
        large: (1500, 35, 0.04, 14, 55, 1 / 1.15, 0.65, 10.0),
    }
    for hp, (hidden, steps, init, max_epoch, max_max, decay, dropout, clip) in expected.items():
        assert (hp.hidden_size, hp.max_length, hp.init_scale, hp.lr_decay_start_epoch, hp.max_epochs,
                hp.lr_decay, hp.dropout, hp.max_grad_norm) == (hidden, steps, init, max_epoch, max_max,
                                                               decay, dropout, clip)
        assert (hp.num_layers, hp.batch_size, hp.learning_rate, hp.optimizer, hp.lr_schedule) == \
               (2, 20, 1.0, "sgd", "epoch_decay")
        assert hp.loss_sum_over_time
        # hparams hold the math only: how it is computed is the Strategy's formulation
        assert not any(hasattr(hp, name) for name in FORMULATION_FIELDS + ("clip_via_lr",))
    example = get_hparams("lstm_lm_example")
    assert (example.hidden_size, example.max_length, example.batch_size, example.dropout,
            example.max_grad_norm, example.learning_rate, example.lr_schedule, example.lr_decay) == \
           (200, 35, 20, 0.2, 0.25, 20.0, "plateau", 0.25)
    assert not example.loss_sum_over_time
    assert models.get("lstm_lm") is LSTMLM and "lstm_lm_small" in hparams_sets


def test_epoch_decay_matches_paper_schedule() -> None:
    from hotloop.schedules import build_schedule
    hp = lstm_lm_small()
    schedule = build_schedule(hp, steps_per_epoch=10)
    lrs = [hp.learning_rate * schedule.multiplier(0, epoch) for epoch in range(7)]
    # TF ptb_word_lm: lr_decay ** max(i + 1 - max_epoch, 0) for 0-based epoch i
    assert lrs == [1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 0.125]  # 4 epochs at lr 1, then halve


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(FormulationError, match="lstm_impl='nope'; choose one of"):
        lstm(lstm_impl="nope")
    with pytest.raises(FormulationError, match="ce_gemm_dtype='fp8'; choose one of"):
        lstm(fused_ce=True, ce_gemm_dtype="fp8")
    with pytest.raises(FormulationError, match="lstm_gemm_dtype='fp8'; choose one of"):
        lstm(lstm_impl="bptt", lstm_gemm_dtype="fp8")
    with pytest.raises(FormulationError, match="needs lstm_impl=bptt"):
        lstm(lstm_impl="fused", lstm_gemm_dtype="bf16")
    with pytest.raises(FormulationError, match="set fused_ce=True"):
        lstm(ce_gemm_dtype="bf16")
    with pytest.raises(ModelMismatchError):
        LSTMLM(tiny_hp(), ProblemSpec("seq2seq", VOCAB, VOCAB))
    model = reference_model()
    with pytest.raises(ValueError, match="state must be"):
        model.loss(make_batch(), model.initial_state(2, torch.device("cpu")))


@pytest.mark.timeout(300)
def test_training_on_a_repeating_stream_lowers_loss() -> None:
    torch.manual_seed(0)
    hp = tiny_hp(hidden_size=32, learning_rate=1.0, max_grad_norm=5.0)
    model = LSTMLM(hp, SPEC)
    opt = build_optimizer(model.parameters(), hp, fused=True)
    step = compile_step(model, None, opt, Strategy(), max_grad_norm=hp.max_grad_norm)
    losses = repeating_stream_losses(step, rows=3, window=6, state=model.initial_state(3, torch.device("cpu")))
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


#: hparams as a checkpoint of lstm_lm_small (hidden 16) stored them, from when the formulation
#: fields (lstm_impl, fused_ce, ...) were hparams: the class by name, the fields as JSON
SAVED_HPARAMS = (
    '{"batch_size": 20, "max_length": 20, "optimizer": "sgd", "learning_rate": 1.0, "lr_schedule": "epoch_decay", '
    '"lr_decay": 0.5, "lr_decay_start_epoch": 4, "max_grad_norm": 5.0, "max_epochs": 13, "hidden_size": 16, '
    '"num_layers": 2, "init_scale": 0.1, "lstm_impl": "bptt", "lstm_gemm_dtype": "fp32", "fused_ce": true, '
    '"ce_chunk_rows": 7, "ce_gemm_dtype": "bf16", "loss_sum_over_time": false, "tie_embeddings": true, '
    '"clip_via_lr": true, "__class__": "hotloop.models.lstm_lm:LSTMLMHParams"}')


def test_saved_hparams_load_and_formulation_fields_point_to_the_strategy() -> None:
    import json

    from hotloop.hparams import HParams, HParamsError, apply_overrides, hparams_from_dict
    from hotloop.models.lstm_lm import LSTMLMHParams
    hp = hparams_from_dict(json.loads(SAVED_HPARAMS))
    assert type(hp) is LSTMLMHParams
    assert (hp.hidden_size, hp.loss_sum_over_time, hp.tie_embeddings) == (16, False, True)
    model = LSTMLM(hp, SPEC)
    assert model.output.weight is model.embedding.weight              # tie_embeddings reached the model
    assert model.formulation == Formulation()                         # a loaded model computes plainly
    with pytest.raises(HParamsError, match="unknown hparam 'hidden_sise'"):
        apply_overrides(hp, "hidden_sise=8")                           # a typo is an error, not a default
    with pytest.raises(HParamsError, match="ce_gemm_dtype is a Strategy field .* --strategy-override"):
        apply_overrides(hp, "ce_gemm_dtype=fp32")
    with pytest.raises(ModelMismatchError, match="LSTMLMHParams"):
        LSTMLM(HParams(hidden_size=12), SPEC)                           # plain HParams: refused, clearly
