"""What an exported model's graph takes and returns, per task.

A registered model maps a batch dict (and a carried state) to ``(logits, state)``.
A runtime graph takes positional tensors instead; :func:`forward_graph` wraps
the model accordingly and :class:`GraphSignature` names the tensors:

- ``classify``: ``images [B, C, H, W]`` (or ``tokens [B, S]`` for token
  classifiers) -> ``logits [B, K]``
- ``lm``: ``tokens [B, T]`` and the carried state ``state0, state1, ...``
  (``lstm_lm``: ``state0 = h``, ``state1 = c``, each ``[L, B, H]``) ->
  ``logits [B, T, V]`` and ``state0_out, state1_out, ...``
- ``segment``: ``images [B, C, H, W]`` -> ``logits [B, K, H, W]``
- ``seq2seq``: ``inputs [B, S]``, ``targets [B, T]`` -> ``logits [B, T, V]``
  (teacher-forced scoring; the model shifts ``targets`` right itself)

Batch and sequence axes are dynamic (named ``batch``, ``seq``, ``target_seq``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..models.formulation import Formulation
from ..problems.base import NUM_RESERVED
from .errors import ExportError

__all__ = ["GraphSignature", "forward_graph", "example_inputs", "state_layout", "inference_form"]


@dataclass
class GraphSignature:
    """Names of a graph's inputs and outputs and which of their axes are dynamic."""

    name: str
    inputs: list[str]
    outputs: list[str]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "inputs": list(self.inputs), "outputs": list(self.outputs),
                "dynamic_axes": {k: {str(a): d for a, d in v.items()} for k, v in self.dynamic_axes.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GraphSignature":
        axes = {k: {int(a): d for a, d in v.items()} for k, v in data.get("dynamic_axes", {}).items()}
        return cls(data["name"], list(data["inputs"]), list(data["outputs"]), axes)


def _uses_images(model: nn.Module) -> bool:
    return model.spec.task in ("classify", "segment") and model.spec.input_vocab_size == 0


def state_layout(model: nn.Module) -> list[int]:
    """The batch axis of each carried-state tensor (empty for stateless models)."""
    one, two = model.initial_state(1, torch.device("cpu")), model.initial_state(2, torch.device("cpu"))
    if one is None:
        return []
    ones = [one] if isinstance(one, Tensor) else list(one)
    twos = [two] if isinstance(two, Tensor) else list(two)
    axes = []
    for a, b in zip(ones, twos):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if len(diff) != 1:
            raise ExportError(f"cannot tell the batch axis of a state tensor of shape {list(a.shape)}")
        axes.append(diff[0])
    return axes


class _ClassifyGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor) -> Tensor:
        targets = torch.zeros((inputs.shape[0], 1), dtype=torch.long, device=inputs.device)   # [B, 1]
        logits, _ = self.model({"inputs": inputs, "targets": targets})                         # [B, 1, K]
        return logits[:, 0]                                                                    # [B, K]


class _SegmentGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        logits, _ = self.model({"inputs": images})                                             # [B, K, H, W]
        return logits


class _LMGraph(nn.Module):
    def __init__(self, model: nn.Module, num_state: int, single_tensor_state: bool) -> None:
        super().__init__()
        self.model, self.num_state, self.single = model, num_state, single_tensor_state

    def forward(self, tokens: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        carried: Any = None
        if self.num_state:
            carried = state[0] if self.single else tuple(state)
        logits, new_state = self.model({"inputs": tokens}, carried)                            # [B, T, V]
        if not self.num_state:
            return (logits,)
        new = [new_state] if self.single else list(new_state)
        return (logits, *new)


class _Seq2SeqGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        logits, _ = self.model({"inputs": inputs, "targets": targets})                         # [B, T, V]
        return logits


def forward_graph(model: nn.Module) -> tuple[nn.Module, GraphSignature]:
    """Wrap ``model`` (eval mode) as a positional-tensor module and name its graph."""
    task = model.spec.task
    if task == "classify":
        name = "images" if _uses_images(model) else "tokens"
        axes = {name: {0: "batch"} if name == "images" else {0: "batch", 1: "seq"}, "logits": {0: "batch"}}
        return _ClassifyGraph(model).eval(), GraphSignature("forward", [name], ["logits"], axes)
    if task == "segment" and _uses_images(model):
        axes = {"images": {0: "batch"}, "logits": {0: "batch"}}
        return _SegmentGraph(model).eval(), GraphSignature("forward", ["images"], ["logits"], axes)
    if task == "lm":
        batch_axes = state_layout(model)
        single = isinstance(model.initial_state(1, torch.device("cpu")), Tensor)
        states = [f"state{i}" for i in range(len(batch_axes))]
        axes: dict[str, dict[int, str]] = {"tokens": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
        for state, axis in zip(states, batch_axes):
            axes[state] = axes[f"{state}_out"] = {axis: "batch"}
        graph = _LMGraph(model, len(states), single).eval()
        return graph, GraphSignature("forward", ["tokens", *states], ["logits", *(f"{s}_out" for s in states)], axes)
    if task == "seq2seq":
        axes = {"inputs": {0: "batch", 1: "seq"}, "targets": {0: "batch", 1: "target_seq"},
                "logits": {0: "batch", 1: "target_seq"}}
        return _Seq2SeqGraph(model).eval(), GraphSignature("forward", ["inputs", "targets"], ["logits"], axes)
    raise ExportError(f"no export graph is defined for task {task!r} (model {type(model).__name__}); "
                      f"exportable tasks: classify, segment, lm, seq2seq")


def _length(limit: int, wanted: int) -> int:
    return max(1, min(wanted, limit)) if limit > 0 else wanted


def example_inputs(model: nn.Module, batch: int = 2, seq: int = 5, *, seed: int = 0) -> tuple[Tensor, ...]:
    """Random inputs for ``forward_graph(model)`` (lengths capped at the spec's maxima)."""
    spec, hp = model.spec, model.hp
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device

    def tokens(vocab: int, length: int) -> Tensor:
        low = NUM_RESERVED if vocab > NUM_RESERVED else 0
        return torch.randint(low, max(vocab, low + 1), (batch, length), generator=gen).to(device)  # [B, L]

    if _uses_images(model):
        size, channels = getattr(hp, "image_size", 32), getattr(hp, "image_channels", 3)
        return (torch.randn(batch, channels, size, size, generator=gen).to(device),)            # [B, C, H, W]
    if spec.task == "classify":
        return (tokens(spec.input_vocab_size, _length(spec.max_input_length, seq)),)
    if spec.task == "lm":
        state = model.initial_state(batch, device)
        states = [] if state is None else [state] if isinstance(state, Tensor) else list(state)
        states = [0.1 * torch.randn(s.shape, generator=gen).to(device) for s in states]
        return (tokens(spec.target_vocab_size, _length(spec.max_input_length, seq)), *states)
    return (tokens(spec.input_vocab_size, _length(spec.max_input_length, seq)),
            tokens(spec.target_vocab_size, _length(spec.max_target_length, max(1, seq - 1))))


def inference_form(model: nn.Module) -> nn.Module:
    """The same function in a formulation that exports with a dynamic time axis.

    ``lstm_lm``'s hand-written recurrences (formulation ``lstm_impl`` unrolled/hoisted/
    bptt) loop over time in Python, which a graph capture unrolls to a fixed length;
    they share ``nn.LSTM``'s parameters, so a copy of the model computes with the
    plain formulation (``nn.LSTM``, fp32 GEMMs) and the same weights.
    """
    formulation = getattr(model, "formulation", None)
    if formulation is None or formulation.lstm_impl == "fused":
        return model
    plain = copy.deepcopy(model)
    plain.use_formulation(Formulation())
    return plain.eval()
