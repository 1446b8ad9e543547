"""Small, deterministic training cases for the built-in models (parity tests, benchmarks).

``model_case(name, size)`` returns a ``build()`` callable that gives a fresh
:class:`~hotloop.engine.parity.ParityCase`: the model built from a fixed seed,
its hparams and ``steps`` batches. ``size`` is ``"tiny"`` (tests) or
``"bench"`` (benchmarks). Every built-in model has one entry in :data:`CASES`;
:func:`models_without_case` lists the built-ins that lack one, so a test can
insist on full coverage.

A model is added with one entry::

    CASES["my_model"] = ModelCase("algorithmic_reverse", "my_model_base",
                                  tiny="batch_size=4,hidden_size=8", bench="batch_size=32")

Errors are not hidden: an unknown problem, a missing module or missing data
raise as they are; only a model with no entry raises :class:`MissingCaseError`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .builtin import BUILTINS, declare_builtins
from .engine.parity import ParityCase
from .engine.strategy import Strategy
from .errors import UserError
from .hparams import HParams, apply_overrides, get_hparams
from .problems.base import Batch, ProblemSpec
from .registry import models

__all__ = ["ModelCase", "MissingCaseError", "CASES", "RANDOM_LM", "SIZES", "model_case",
           "build_from_registry", "builtin_model_names", "models_without_case"]

#: pseudo-problem of :class:`ModelCase`: one random token stream cut into ``[B, T]`` windows
RANDOM_LM = "random_lm"
#: the sizes a case comes in, and the vocabulary of :data:`RANDOM_LM` at each size
SIZES: dict[str, int] = {"tiny": 50, "bench": 2000}


class MissingCaseError(UserError, KeyError):
    """The model has no entry in :data:`CASES`."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ModelCase:
    """Where a model's small case comes from: a problem, an hparams set and two sets of overrides."""

    problem: str                 # registered problem, or RANDOM_LM
    hparams: str                 # registered hparams set
    tiny: str                    # overrides for tests (seconds on one CPU core)
    bench: str                   # overrides for benchmarks
    formulation: str = ""        # Strategy formulation fields "k=v,..." the case computes with


CASES: dict[str, ModelCase] = {
    "transformer": ModelCase("algorithmic_reverse", "transformer_algorithmic",
                             "batch_size=8,hidden_size=16,filter_size=32,num_layers=1,train_length=6",
                             "batch_size=32,hidden_size=64,filter_size=128,num_layers=2,train_length=12"),
    "mlp": ModelCase("algorithmic_reverse", "mlp_algorithmic",
                     "batch_size=8,hidden_size=8,filter_size=32,num_layers=2,train_length=6",
                     "batch_size=64,hidden_size=32,filter_size=512,num_layers=2,train_length=12"),
    "lstm_seq2seq": ModelCase("algorithmic_reverse", "lstm_seq2seq_algorithmic",
                              "batch_size=8,hidden_size=16,train_length=6",
                              "batch_size=32,hidden_size=64,train_length=12"),
    "conv_net": ModelCase("image_synthetic", "conv_net_base",
                          "batch_size=4,image_size=8,conv_channels=4:8",
                          "batch_size=32,image_size=32,conv_channels=16:32:32"),
    "lstm_lm": ModelCase(RANDOM_LM, "lstm_lm_small",
                         "batch_size=4,max_length=5,hidden_size=16",
                         "batch_size=20,max_length=20,hidden_size=200", formulation="lstm_impl=unrolled"),
    "se_resnext50": ModelCase("image_mnist", "se_resnext_small",
                              "batch_size=4,stage_blocks=1:1,stem_channels=8,stage_channels=16,cardinality=4",
                              "batch_size=64"),
    "deeplabv3plus": ModelCase("segment_shapes", "deeplabv3plus_small",
                               "batch_size=2,image_size=32,stem_channels=8,backbone_width=8,backbone_channels=16,"
                               "aspp_channels=16,low_level_channels=8,decoder_channels=8",
                               "batch_size=16"),
    "bert": ModelCase("bert_pretrain_ptb", "bert_tiny",
                      "batch_size=4,hidden_size=16,num_heads=2,filter_size=32,num_layers=1,max_length=32", "batch_size=32"),
    "cyclegan": ModelCase("shapes_unpaired", "cyclegan_small",
                          "batch_size=2,image_size=32,gen_filters=4,disc_filters=4,gen_blocks=1,pool_size=2",
                          "batch_size=4"),
    "yolov3": ModelCase("detection_shapes", "yolov3_tiny", "batch_size=2", "batch_size=8"),
    "mask_rcnn": ModelCase("detection_shapes", "mask_rcnn_tiny", "batch_size=2", "batch_size=4"),
    "multimodel": ModelCase("algorithmic_copy,algorithmic_reverse", "multimodel_tiny",
                            "batch_size=4,hidden_size=16,filter_size=32,num_layers=1,train_length=6",
                            "batch_size=32"),
}


def builtin_model_names() -> list[str]:
    """The models that :data:`hotloop.builtin.BUILTINS` declares (user registrations excluded)."""
    return sorted(BUILTINS[models])


def models_without_case() -> list[str]:
    """Built-in models with no entry in :data:`CASES` (empty when coverage is complete)."""
    return [name for name in builtin_model_names() if name not in CASES]


def _random_lm_batches(hp: HParams, vocab: int, steps: int, seed: int) -> list[Batch]:
    """Contiguous windows of one random token stream: inputs [B, T], targets shifted by one."""
    g = torch.Generator().manual_seed(seed)
    b, t = hp.batch_size, max(hp.max_length, 1)
    stream = torch.randint(2, vocab, (b, steps * t + 1), generator=g)          # [B, steps*T + 1]
    return [{"inputs": stream[:, i * t:(i + 1) * t].clone(),
             "targets": stream[:, i * t + 1:(i + 1) * t + 1].clone()} for i in range(steps)]


def build_from_registry(model: str, problem: str, hp: HParams, steps: int, *, seed: int = 0,
                        lm_vocab: int = SIZES["tiny"], formulation: str = "") -> Callable[[], ParityCase]:
    """``build()`` for any registered (model, problem, hparams): the same seed gives the same model and batches.

    ``problem`` may be :data:`RANDOM_LM` (a streamed LM over ``lm_vocab`` random tokens).
    ``formulation``: Strategy formulation fields (``"lstm_impl=unrolled"``) the case computes with.
    The batches are read once, here; each ``build()`` makes a fresh model.
    """
    if problem == RANDOM_LM:
        spec = ProblemSpec(task="lm", input_vocab_size=lm_vocab, target_vocab_size=lm_vocab, streamed=True)
        batches = _random_lm_batches(hp, lm_vocab, steps, seed)
    else:
        from .compose.build import problem_class
        prob = problem_class(problem, models.get(model))()
        spec = prob.spec(hp)
        it = iter(prob.reader("train", hp, seed=seed))
        batches = [next(it) for _ in range(steps)]
    model_cls = models.get(model)
    form = Strategy.parse(formulation).formulation

    def build() -> ParityCase:
        torch.manual_seed(seed)
        net = model_cls(hp, spec)
        state = None
        if spec.streamed:   # one step signature from the first step on
            state = net.initial_state(batches[0]["inputs"].shape[0], torch.device("cpu"))
        return ParityCase(net, hp, batches, max_grad_norm=hp.max_grad_norm, state=state, formulation=form)

    return build


def model_case(name: str, size: str = "tiny", steps: int = 3, *, overrides: str | None = None,
               seed: int = 0, formulation: str | None = None) -> Callable[[], ParityCase]:
    """The ``size`` case of model ``name`` with ``steps`` batches (``overrides`` applied last;
    ``formulation``, Strategy formulation fields, replaces the case's own).

    Raises :class:`MissingCaseError` when :data:`CASES` has no entry for ``name``;
    any other failure (unknown names, missing data or modules) propagates.
    """
    if size not in SIZES:
        raise ValueError(f"unknown case size {size!r}; use one of {list(SIZES)}")
    declare_builtins()
    config = CASES.get(name)
    if config is None:
        raise MissingCaseError(f"model {name!r} has no case in hotloop.testing.CASES "
                               f"(cases exist for {', '.join(sorted(CASES))})")
    hp = get_hparams(config.hparams, config.tiny if size == "tiny" else config.bench)
    hp = apply_overrides(hp, overrides)
    return build_from_registry(name, config.problem, hp, steps, seed=seed, lm_vocab=SIZES[size],
                               formulation=config.formulation if formulation is None else formulation)
