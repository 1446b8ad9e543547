"""The models the inference bench measures, built with random weights from the registry.

``transformer``, ``lstm_lm`` and ``conv_net`` use fixed presets (the sizes
trained in this repository: Multi30k, PTB small, 32x32 images). Any other
registered model (the zoo) uses the default hparams set of a problem whose
set is named after the model (else a set named ``<model>_*``) and that
problem's spec; a model without a usable set or graph is skipped with a reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..hparams import HParams, get_hparams
from ..problems.base import ProblemSpec
from ..registry import hparams_sets, models, problems
from .graphs import forward_graph, inference_form
from .errors import ExportError

__all__ = ["BenchSubject", "DEFAULT_MODELS", "build_subject", "subject_from_model", "default_model_names"]

DEFAULT_MODELS = ("transformer", "lstm_lm", "conv_net")
_PRESETS: dict[str, tuple[tuple[str, ...], ProblemSpec, int]] = {
    # name: (hparams sets, first registered wins; spec; sequence length)
    "transformer": (("transformer_multi30k", "transformer_base_small"),
                    ProblemSpec("seq2seq", 8000, 8000, 128, 128), 24),
    "lstm_lm": (("lstm_lm_small",), ProblemSpec("lm", 10000, 10000, 20, 20, streamed=True, pad_id=-1), 20),
    "conv_net": (("conv_net_base",), ProblemSpec("classify", 0, 10, 0, 1, pad_id=-1), 0),
}
_ZOO_SEQ = 16


@dataclass
class BenchSubject:
    """A model to measure: the eval-mode module, its runtime graph and the input length."""

    name: str
    model: nn.Module
    seq: int = _ZOO_SEQ
    note: str = ""

    def graph(self) -> tuple[nn.Module, Any]:
        return forward_graph(self.model)


def subject_from_model(name: str, model: nn.Module, seq: int = _ZOO_SEQ, note: str = "") -> BenchSubject:
    """Wrap an already built model (e.g. a trained run's) in its exportable formulation."""
    model = inference_form(model.to("cpu").eval())
    forward_graph(model)   # raises ExportError for a task without a graph
    return BenchSubject(name, model, seq, note)


def _build(name: str, hp: HParams, spec: ProblemSpec, seq: int, note: str) -> BenchSubject:
    torch.manual_seed(hp.seed)
    return subject_from_model(name, models.get(name)(hp, spec), seq, note)


def _zoo_choice(name: str) -> tuple[str, ProblemSpec]:
    tasks = getattr(models.get(name), "tasks", ())
    family = name.split("_")[0].rstrip("0123456789")
    candidates: list[tuple[int, str, str]] = []
    for problem in problems.names():
        cls = problems.get(problem)
        hp_name = getattr(cls, "default_hparams", "")
        if getattr(cls, "task", None) in tasks and hp_name and hp_name.startswith(family):
            candidates.append((0, hp_name, problem))
    for hp_name in hparams_sets.names():
        if hp_name.startswith(f"{name}_"):
            for problem in problems.names():
                if getattr(problems.get(problem), "task", None) in tasks:
                    candidates.append((1, hp_name, problem))
    for _, hp_name, problem in sorted(candidates):
        hp = get_hparams(hp_name)
        try:
            return hp_name, problems.get(problem)().spec(hp)
        except Exception:  # noqa: BLE001 - a problem whose spec needs data: try the next one
            continue
    raise ExportError(f"no hparams set and problem found for model {name!r}")


def build_subject(name: str, overrides: str | None = None) -> BenchSubject:
    """The bench model ``name`` with random weights (``overrides`` apply to its hparams set)."""
    if name in _PRESETS:
        sets, spec, seq = _PRESETS[name]
        hp_name = next((s for s in sets if s in hparams_sets), None)
        if hp_name is None:
            raise ExportError(f"none of the hparams sets {list(sets)} of bench model {name!r} is registered")
        hp = get_hparams(hp_name, overrides)
        return _build(name, hp, spec, seq or _ZOO_SEQ, f"hparams {hp_name}")
    hp_name, spec = _zoo_choice(name)
    return _build(name, get_hparams(hp_name, overrides), spec, _ZOO_SEQ, f"hparams {hp_name}")


def default_model_names() -> list[str]:
    """The three named models, then every other registered model (the zoo)."""
    return list(DEFAULT_MODELS) + [n for n in models.names() if n not in DEFAULT_MODELS]
