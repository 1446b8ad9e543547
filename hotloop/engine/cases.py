"""Small, deterministic training cases for every registered model (parity tests, benchmarks, explain).

``model_case(name, size)`` returns a ``build()`` callable giving a fresh
:class:`~hotloop.engine.parity.ParityCase` (model from a fixed seed, its hparams,
``steps`` batches), or raises :class:`CaseUnavailable` when the model's problem
needs data or code that is not here. ``size`` is "tiny" (tests) or "bench".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..hparams import HParams, apply_overrides, get_hparams
from ..problems.base import ProblemSpec
from ..registry import models, problems
from .parity import ParityCase

__all__ = ["CaseUnavailable", "CaseConfig", "CASES", "model_case", "build_from_registry"]


class CaseUnavailable(RuntimeError):
    """The model has no small case here (unknown problem, missing data or module)."""


@dataclass(frozen=True)
class CaseConfig:
    problem: str                 # registered problem, or "random_lm" (a random token stream)
    hparams: str                 # registered hparams set
    tiny: str                    # overrides for tests
    bench: str                   # overrides for benchmarks


CASES: dict[str, CaseConfig] = {
    "transformer": CaseConfig("algorithmic_reverse", "transformer_algorithmic",
                              "batch_size=8,hidden_size=16,filter_size=32,num_layers=1,train_length=6",
                              "batch_size=32,hidden_size=64,filter_size=128,num_layers=2,train_length=12"),
    "mlp": CaseConfig("algorithmic_reverse", "mlp_algorithmic",
                      "batch_size=8,hidden_size=8,filter_size=32,num_layers=2,train_length=6",
                      "batch_size=64,hidden_size=32,filter_size=512,num_layers=2,train_length=12"),
    "lstm_seq2seq": CaseConfig("algorithmic_reverse", "lstm_seq2seq_algorithmic",
                               "batch_size=8,hidden_size=16,train_length=6",
                               "batch_size=32,hidden_size=64,train_length=12"),
    "conv_net": CaseConfig("image_synthetic", "conv_net_base",
                           "batch_size=4,image_size=8,conv_channels=4:8",
                           "batch_size=32,image_size=32,conv_channels=16:32:32"),
    "lstm_lm": CaseConfig("random_lm", "lstm_lm_small",
                          "batch_size=4,max_length=5,hidden_size=16,lstm_impl=unrolled,fused_ce=false",
                          "batch_size=20,max_length=20,hidden_size=200,lstm_impl=unrolled,fused_ce=false"),
}
_LM_VOCAB = {"tiny": 50, "bench": 2000}


def _random_lm_batches(hp: HParams, vocab: int, steps: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Contiguous windows of one random token stream: [B, T] inputs, targets shifted by one."""
    g = torch.Generator().manual_seed(seed)
    b, t = hp.batch_size, max(hp.max_length, 1)
    stream = torch.randint(2, vocab, (b, steps * t + 1), generator=g)
    return [{"inputs": stream[:, i * t:(i + 1) * t].clone(), "targets": stream[:, i * t + 1:(i + 1) * t + 1].clone()}
            for i in range(steps)]


def build_from_registry(model: str, problem: str, hp: HParams, steps: int, *, seed: int = 0,
                        lm_vocab: int = 50) -> Callable[[], ParityCase]:
    """``build()`` for any (model, problem, hparams): same seed -> same model and batches."""
    if problem == "random_lm":
        spec = ProblemSpec(task="lm", input_vocab_size=lm_vocab, target_vocab_size=lm_vocab, streamed=True)
        batches = _random_lm_batches(hp, lm_vocab, steps, seed)
    else:
        prob = problems.get(problem)()
        spec = prob.spec(hp)
        it = iter(prob.reader("train", hp, seed=seed))
        batches = [next(it) for _ in range(steps)]
    model_cls = models.get(model)

    def build() -> ParityCase:
        torch.manual_seed(seed)
        net = model_cls(hp, spec)
        state = None
        if spec.streamed and hasattr(net, "initial_state"):   # one signature from the first step on
            state = net.initial_state(batches[0]["inputs"].shape[0], torch.device("cpu"))
        return ParityCase(net, hp, batches, max_grad_norm=hp.max_grad_norm, state=state)

    return build


def model_case(name: str, size: str = "tiny", steps: int = 3, *, overrides: str | None = None,
               seed: int = 0) -> Callable[[], ParityCase]:
    """The small case for registered model ``name``; raises :class:`CaseUnavailable`."""
    config = CASES.get(name)
    if config is None:
        raise CaseUnavailable(f"model {name!r} has no small case in hotloop.engine.cases.CASES")
    try:
        hp = get_hparams(config.hparams, config.tiny if size == "tiny" else config.bench)
        hp = apply_overrides(hp, overrides)
        return build_from_registry(name, config.problem, hp, steps, seed=seed,
                                   lm_vocab=_LM_VOCAB.get(size, 50))
    except (ImportError, KeyError, FileNotFoundError, OSError) as exc:
        raise CaseUnavailable(f"model {name!r}: {type(exc).__name__}: {exc}") from exc


def describe(build: Callable[[], ParityCase]) -> dict[str, Any]:
    case = build()
    return {"model": type(case.model).__name__,
            "parameters": sum(p.numel() for p in case.model.parameters())}
