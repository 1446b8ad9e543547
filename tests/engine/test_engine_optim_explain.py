"""Fused (multi-tensor) optimizer updates vs the per-tensor loop; ``hotloop explain``; inductor."""

import pytest
import torch

from hotloop.engine import Strategy
from hotloop.ops.cpu_isa import cpu_isa
from hotloop.testing import model_case
from hotloop.cli import main as cli_main
from hotloop.engine.parity import check_parity
from hotloop.hparams import HParams
from hotloop.optim import build_optimizer, sparse_gradient_modules


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_foreach_update_equals_per_tensor_loop_bitwise(name):
    hp = HParams(optimizer=name, learning_rate=0.05, weight_decay=0.01)
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(11))]
        opt = build_optimizer(params, hp, fused=fused)
        assert opt.param_groups[0]["foreach"] is fused
        for step in range(4):
            for p in params:
                p.grad = torch.cos(p.detach() * (step + 1))
            opt.step()
        results.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_foreach_update_is_bitwise_on_real_models(name):
    """The docs' "bitwise for all four" on models, not only on two loose tensors: the tiny
    transformer (attention, layer norm, gradient clipping) and LSTM LM, 10 steps each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                      # shared cores: keep it fast under load
    try:
        for model in ("transformer", "lstm_lm"):
            build = model_case(model, "tiny", steps=10, overrides=f"optimizer={name}")
            result = check_parity(build, Strategy(fused_optimizer=True), steps=10, tol=0)
            assert result.ok and result.max_abs_diff == 0.0, (model, result.max_abs_diff)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])   # clipped, and coefficient exactly 1
def test_clip_grad_norm_is_bitwise_torch_and_skips_the_identity_multiply(max_norm, monkeypatch):
    from hotloop.engine.clipping import clip_grad_norm
    torch.manual_seed(1)
    grads = [torch.randn(40, 30), torch.randn(17)]
    mine = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for a, b, g in zip(mine, ref, grads):
        a.grad, b.grad = g.clone(), g.clone()
    want = torch.nn.utils.clip_grad_norm_(ref, max_norm, foreach=True)
    multiplies = []
    real_mul = torch._foreach_mul_
    monkeypatch.setattr(torch, "_foreach_mul_", lambda *a, **k: multiplies.append(1) or real_mul(*a, **k))
    got = clip_grad_norm(mine, max_norm)
    assert torch.equal(got, want)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(mine, ref))
    assert len(multiplies) == (1 if max_norm < float(want) else 0)


def test_fused_optimizer_strategy_trains_bitwise_like_the_loop():
    result = check_parity(model_case("mlp", "tiny", steps=3), Strategy(fused_optimizer=True))
    assert result.ok and result.max_abs_diff == 0.0


def test_sparse_gradient_detection():
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3, sparse=True), torch.nn.Linear(3, 2))
    assert sparse_gradient_modules(model) == ["0"]
    assert sparse_gradient_modules(torch.nn.Embedding(5, 3)) == []


TINY = "batch_size=4,hidden_size=8,filter_size=32,num_layers=2,train_length=5"


def explain_main(argv):
    return cli_main(["explain", "--device", "cpu", *argv])


def test_explain_with_no_arguments_explains_the_default_run(capsys):
    assert cli_main(["explain"]) == 0
    out = capsys.readouterr().out
    assert "algorithmic_reverse / transformer / transformer_algorithmic" in out
    assert "== effective strategy ==" in out and "fallback: none" in out


@pytest.mark.timeout(120)
def test_explain_prints_strategy_passes_and_memory(capsys):
    code = explain_main(["--problem", "algorithmic_reverse", "--model", "mlp", "--override", TINY,
                         "--strategy-override", "backend=graph,graph_passes=true,inplace=true"])
    out = capsys.readouterr().out
    assert code == 0
    assert "backend = 'graph'   (override)" in out
    assert "collapse_views: " in out and "t_pair=10" in out and "unbind_slices:" in out
    assert "inplace_activations: 2 match(es) [relu_inplace=2" in out
    assert "fallback: none" in out
    assert "activations (peak live intermediates" in out


@pytest.mark.timeout(120)
def test_explain_reports_fallback_reason(capsys):
    code = explain_main(["--problem", "algorithmic_reverse", "--model", "lstm_seq2seq",
                         "--override", "batch_size=4,hidden_size=8,train_length=4",
                         "--strategy-override", "backend=graph"])
    out = capsys.readouterr().out
    assert code == 0 and "fallback: unsupported op" in out and "mkldnn_rnn_layer" in out


@pytest.mark.parametrize("argv, message", [
    (["--problem", "algorithmic_reverse", "--model", "transformer", "--strategy-override", "precision=fp16"],
     "fp16 needs CUDA"),
    (["--problem", "nope", "--model", "transformer"], "unknown problem"),
    (["--problem", "algorithmic_reverse", "--model", "transformer", "--strategy-override", "bogus=1"],
     "unknown strategy field"),
])
def test_explain_errors_are_one_line(capsys, argv, message):
    assert explain_main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_inductor_falls_back_when_compile_fails(monkeypatch):
    def broken_compile(fn, **kwargs):
        def run(*a, **k):
            raise RuntimeError("no backend here")
        return run
    monkeypatch.setattr(torch, "compile", broken_compile)
    result = check_parity(model_case("mlp", "tiny", steps=2), Strategy(backend="inductor"), steps=2)
    assert result.ok and "torch.compile failed: RuntimeError: no backend here" in result.fallback_reason


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_inductor_backend_trains_like_eager():
    """The real inductor compile of the tiny MLP with dropout (about 25 s with a warm inductor cache
    on 2 busy cores, about 55 s cold): auto may propose this backend, so it runs in every suite.
    The compiled step draws eager's dropout masks, so it is held to the plain fp32 tolerances."""
    result = check_parity(model_case("mlp", "tiny", steps=3, overrides="dropout=0.3"), Strategy(backend="inductor"))
    if "avx512" not in cpu_isa().usable and result.fallback_reason is not None:
        # torch 2.13's inductor, vectorising for AVX2 (ATEN_CPU_CAPABILITY=avx2 on the AVX512-BF16
        # EPYC), generated a kernel that fails its own bounds check ("index out of bounds:
        # 0 <= tmp2 < 12") on this model: the step must then fall back to eager and say why
        assert result.fallback_reason.startswith("fallback: torch.compile failed"), result
        assert result.ok and result.max_abs_diff == 0.0, result
        return
    assert result.ok and result.fallback_reason is None, result
    assert result.update is not None and result.update.within(result.update_tol), result.reason()


@pytest.mark.timeout(120)
def test_channels_last_conv_net_trains_like_eager():
    build = model_case("conv_net", "tiny", steps=2)
    for strategy in (Strategy(channels_last=True), Strategy(channels_last=True, backend="graph")):
        result = check_parity(build, strategy, steps=2, tol=1e-5)   # oneDNN may pick other conv kernels
        assert result.ok, result
        assert any("channels_last" in line for line in result.report)
        assert result.fallback_reason is None
