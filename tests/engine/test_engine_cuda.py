"""The engine on a CUDA device: every model's step under each GPU strategy against eager fp32 on
the same device, fp16 with its GradScaler, inductor with CUDA graphs, resume and decoding.

Skipped where no GPU is present (CI has none); run on a GPU machine with
``python -m pytest tests/engine/test_engine_cuda.py``. Some CUDA backward kernels
(embedding, index_add) accumulate with atomics in any order, and Adam's first
updates (about ``±lr`` per entry) turn a last-bit difference of a near-zero gradient
into a visible one, so the tests run with ``torch.use_deterministic_algorithms``.
Resume is then bitwise; strategies are compared with
:func:`hotloop.engine.parity.default_tolerance`'s tolerances, and 1e-5 for fp32.
"""
from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS; read at its first use

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import StopAt, TinyStreamLM, make_trainer, params_of, tiny_hp, tiny_lm_hp  # noqa: E402
from hotloop.engine import Strategy  # noqa: E402
from hotloop.engine.parity import ParityCase, check_parity, default_tolerance  # noqa: E402
from hotloop.testing import model_case  # noqa: E402

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.timeout(600)]

CUDA = torch.device("cuda")
FP32_TOL = 1e-5
STRATEGIES = {
    "eager_fused_opt": Strategy(fused_optimizer=True),
    "graph_plain": Strategy(backend="graph", fused_optimizer=False),
    "graph_passes": Strategy(backend="graph", graph_passes=True, fused_optimizer=True),
    "eager_bf16": Strategy(precision="bf16"),
    "eager_fp16": Strategy(precision="fp16"),
}
CHANNELS_LAST = Strategy(channels_last=True)
CONV_MODELS = {"conv_net", "se_resnext50", "deeplabv3plus", "cyclegan", "yolov3", "mask_rcnn"}
#: yolov3 is left out: its eager fp32 reference is not reproducible on CUDA even with deterministic
#: algorithms asked for (two runs of the same 3 steps on an H200 gave third losses 20.108 and 18.776);
#: its ops are checked on CUDA by tests/ops and its training by benchmarks/zoo.py's last-block loss
MODELS = ["mlp", "transformer", "conv_net", "lstm_lm", "lstm_seq2seq", "se_resnext50", "deeplabv3plus",
          "bert", "cyclegan", "mask_rcnn", "multimodel"]
#: fp16 / bf16 are compared over a run elsewhere (benchmarks/zoo.py) for the model whose 3 random-weight
#: steps bf16 already moves by 9% on the CPU (see test_engine_parity_matrix.BF16_UNCHECKED)
LOW_PRECISION_UNCHECKED = {"yolov3"}
#: GradScaler starts at 2**16 and skips the updates whose gradients overflow while it calibrates; in
#: these two models' 3 random-weight steps that shrinks or turns the update (H200: size 0.59, cos 0.52
#: for cyclegan; cos 0.23 for deeplabv3plus), so 3 steps cannot match fp32's update
FP16_UNCHECKED = {"cyclegan", "deeplabv3plus"}
#: channels_last loss tolerances above 1e-4, measured on an H200: cyclegan's two phases (generator,
#: discriminator) run other cuDNN algorithms in the other layout; its second loss moved by 1.5e-2
CHANNELS_LAST_TOL = {"cyclegan": 3e-2}
#: loss tolerances above default_tolerance's 3e-2 for bf16, each measured on an H200:
#: deeplabv3plus's tiny case normalises batches of 2 (BatchNorm); bf16 moves its third loss by 3.1%
BF16_LOSS_TOL = {"deeplabv3plus": 6e-2}


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    return value


def _on_cuda(name: str):
    build = model_case(name, "tiny", steps=3)

    def cuda_build() -> ParityCase:
        case = build()
        case.model.to(CUDA)
        case.state = _to(case.state, CUDA)
        return case
    return cuda_build


@pytest.fixture(autouse=True)
def deterministic_fp32():
    """Deterministic kernels, and full fp32 (cuDNN convolves in TF32 by default)."""
    before = (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
              torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = before[0], before[3]
    torch.set_float32_matmul_precision(before[1])
    torch.use_deterministic_algorithms(before[2])


def _tolerance(name: str, strategy: Strategy) -> float | None:
    if strategy.channels_last:
        return CHANNELS_LAST_TOL.get(name, 1e-4)     # cuDNN picks other algorithms for the other layout
    if strategy.precision == "bf16":
        return BF16_LOSS_TOL.get(name)
    return FP32_TOL if default_tolerance(strategy, CUDA) == 0.0 else None


@pytest.mark.parametrize("name", MODELS)
def test_every_gpu_strategy_matches_eager_fp32_on_cuda(name):
    build = _on_cuda(name)
    failures = []
    strategies = dict(STRATEGIES)
    if name in CONV_MODELS:
        strategies["channels_last"] = CHANNELS_LAST
    for label, strategy in strategies.items():
        if strategy.precision != "fp32" and name in LOW_PRECISION_UNCHECKED:
            continue
        if strategy.precision == "fp16" and name in FP16_UNCHECKED:
            continue
        result = check_parity(build, strategy, steps=3, tol=_tolerance(name, strategy))
        if not result.ok:
            failures.append(f"{label}: {result.reason()} losses {result.losses} vs {result.losses_ref} "
                            f"({result.fallback_reason})")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_inductor_on_cuda_matches_eager(cuda_graphs):
    result = check_parity(_on_cuda("mlp"), Strategy(backend="inductor", cuda_graphs=cuda_graphs), steps=3)
    assert result.ok, result.reason()
    assert not result.fallback_reason



def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = {k: float((a[k].double() - b[k].double()).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not different, f"parameters differ after resume (max abs diff): {different}"


#: nn.LSTM's inter-layer dropout runs inside cuDNN, whose dropout state is seeded once per process and is
#: not part of torch's CUDA RNG state, so a resumed run draws other masks (H200: max abs diff 0.047 after
#: 10 steps, the same numbers in two runs). lstm_impl=unrolled/hoisted/bptt draw their masks from torch.
CUDNN_DROPOUT = pytest.mark.xfail(strict=True, reason="cuDNN's LSTM dropout state is not checkpointed")


@pytest.mark.parametrize("kind", ["transformer", pytest.param("streamed_lm", marks=CUDNN_DROPOUT)])
def test_resume_on_cuda_is_bitwise(tmp_path, kind):
    kwargs: dict[str, Any] = dict(hp=tiny_hp("dropout=0.1"), device="cuda", strategy=Strategy(prefetch=2))
    if kind == "streamed_lm":
        kwargs.update(hp=tiny_lm_hp(), problem=TinyStreamLM(), model_name="lstm_lm")
    straight = make_trainer(tmp_path / "straight", max_steps=10, **kwargs)
    straight.fit()
    first = make_trainer(tmp_path / "resumed", max_steps=10, callbacks=[StopAt(4)], **kwargs)
    assert first.fit().steps == 4
    second = make_trainer(tmp_path / "resumed", max_steps=10, **kwargs)
    assert second.fit(resume=True).steps == 10
    assert all(p.is_cuda for p in second.model.parameters())
    _assert_bitwise(params_of(straight), params_of(second))


def test_cached_decoding_equals_uncached_on_cuda():
    from hotloop.decode.search import beam_search, greedy_search, max_target_lengths
    from hotloop.hparams import get_hparams
    from hotloop.problems.base import EOS_ID, ProblemSpec
    from hotloop.registry import models
    hp = get_hparams("transformer_base_small").replace(hidden_size=32, num_heads=4, filter_size=64, num_layers=2)
    torch.manual_seed(3)
    model = models.get("transformer")(hp, ProblemSpec("seq2seq", 30, 30, 24, 24)).to(CUDA).eval()
    inputs = torch.randint(2, 30, (4, 7), device=CUDA)
    inputs[:, -1] = EOS_ID
    lengths = max_target_lengths(inputs, extra=6, cap=model.max_decode_length)
    greedy = greedy_search(model, inputs, lengths)
    assert greedy.is_cuda
    assert torch.equal(greedy, greedy_search(model, inputs, lengths, cached=False))
    beam = beam_search(model, inputs, lengths, beam_size=4, alpha=0.6)
    assert torch.equal(beam.tokens, beam_search(model, inputs, lengths, beam_size=4, alpha=0.6, cached=False).tokens)
    one = beam_search(model, inputs, lengths, beam_size=1, alpha=0.6)
    assert torch.equal(one.tokens, greedy)
