"""`Strategy`: one typed, validated object holding every speed knob.

Paddle split these over BuildStrategy, ExecutionStrategy and FLAGS; here they
are one frozen dataclass. Values arrive typed: ``Strategy.parse_overrides`` converts the
user's ``"k=v"`` text once, ``Strategy.from_mapping`` checks a mapping (a JSON/YAML file,
``run.json``) by name and type without any text. ``validate(device)`` rejects fields that do
not apply to the hardware and incompatible combinations, once: a Strategy that passed for a
device is trusted there afterwards.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import StrategyError
from ..hparams import HParamsError, apply_overrides, parse_overrides, typed_value
from ..models.formulation import FORMULATION_FIELDS, Formulation, FormulationError
from .conv_formulations import dilated_conv_sites, pointwise_conv_sites
from .linear_formulations import attention_sites, linear_sites
from .norm_formulations import batch_norm_sites, instance_norm_sites
from .dropout_masks import has_dropout

__all__ = ["Strategy", "StrategyError", "validate_for_model"]


@dataclass(frozen=True)
class Strategy:
    # build options
    graph_passes: bool = False          # run hotloop's rewrite passes on the captured graph
    disabled_passes: tuple[str, ...] = ()  # pass names to skip (override syntax: "a:b")
    fast_math: bool = False             # also run passes that change rounding (fuse_cross_entropy)
    fused_optimizer: bool = True        # multi-tensor (foreach / fused) optimizer update
    fused_kernel: bool = False          # with fused_optimizer: torch's one-kernel update (fused=True) on
                                        # CPU too, where torch has one (CUDA uses it always; ~1 ulp off foreach)
    inplace: bool = False               # inplace activations where safe
    backend: str = "eager"              # "eager" | "graph" (own executor) | "inductor"
    cuda_graphs: bool = False
    # execution options
    intra_op_threads: int = 0           # 0 = leave torch's default
    inter_op_threads: int = 0
    executor: str = "serial"            # "serial" | "parallel" (graph backend only)
    sync_every: int = 50                # host-sync / metric-read cadence in steps
    # precision
    precision: str = "fp32"             # "fp32" | "bf16" | "fp16"
    # device flags
    cudnn_benchmark: bool = False
    tf32: bool = False
    onednn: bool = True
    channels_last: bool = False
    # input pipeline
    prefetch: int = 2                   # async prefetch queue capacity; 0 = synchronous
    num_workers: int = 0
    speed_test: bool = False            # serve one prepared batch repeatedly (compute-only)
    # data parallel
    data_parallel: str = "none"         # "none" | "allreduce" (DDP) | "reduce" (ZeRO-1) | "fsdp" (FSDP2)
    bucket_mb: float = 25.0
    reshard_after_forward: bool = True  # fsdp: free each block's gathered parameters after its forward
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    memory_budget_gb: float = 0.0       # auto's layout choice: bytes a rank may hold (0: the device's)
    # formulation: how the model computes the same math (models/formulation.py; read by the
    # models that name them in ``formulation_fields``). Every default is the plain fp32 one.
    lstm_impl: str = "fused"            # "fused" (nn.LSTM) | "unrolled" | "hoisted" | "bptt"
    lstm_gemm_dtype: str = "fp32"       # bptt GEMM operands "fp32" | "bf16" (changes rounding)
    fused_ce: bool = False              # chunked output projection + cross-entropy
    ce_chunk_rows: int = 0              # rows of logits live at once in fused_ce (0: its default)
    ce_gemm_dtype: str = "fp32"         # fused_ce GEMM operands "fp32" | "bf16" (changes rounding)
    dropout_masks: str = "bernoulli"    # "bernoulli" | "bits16" (other random draws, same rate)
    roi_align_impl: str = "gather"      # "gather" | "separable" (two batched GEMMs; fp32 reordering)
    dilated_conv_wgrad: str = "aten"    # "aten" | "taps" (per-tap GEMMs; fp32 reordering)
    pointwise_conv: str = "aten"        # "aten" | "gemm" (small 1x1 conv calls; fp32 reordering)
    se_backward: str = "aten"           # "aten" | "fused" (squeeze-excitation backward; the same numbers)
    instance_norm: str = "aten"         # "aten" | "per_sample" (channels-last instance norms; fp32 reordering)
    batch_norm: str = "aten"            # "aten" | "two_pass" (channels-last batch-norm statistics; fp32 reordering)
    linear_gemm: str = "aten"           # "aten" | "onednn" (nn.Linear GEMMs from oneDNN, CPU; fp32 reordering)
    clip_via_lr: bool = False           # plain SGD: clip by scaling the step's lr (changes rounding)

    @property
    def formulation(self) -> Formulation:
        """The formulation fields as the typed object models read."""
        return Formulation(**{name: getattr(self, name) for name in FORMULATION_FIELDS})

    def replace(self, **changes: Any) -> "Strategy":
        return dataclasses.replace(self, **changes)

    def changes_from(self, base: "Strategy") -> dict[str, Any]:
        """The fields where this Strategy differs from ``base``, with this one's values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(base, f.name)}

    @staticmethod
    def parse_overrides(text: str | None) -> dict[str, Any]:
        """``"k=v,k=v"`` -> typed field changes; unknown fields and bad values raise StrategyError."""
        if not text:
            return {}
        try:
            keys = [key for key, _ in parse_overrides(text)]
            parsed = apply_overrides(Strategy(), text)
        except HParamsError as exc:
            raise StrategyError(str(exc).replace("hparam", "strategy field")) from None
        return {key: getattr(parsed, key) for key in keys}

    @classmethod
    def parse(cls, text: str | None, base: "Strategy | None" = None) -> "Strategy":
        """``base`` (default ``Strategy()``) with the ``"k=v,..."`` overrides in ``text`` applied."""
        return (base or cls()).replace(**cls.parse_overrides(text))

    @staticmethod
    def field_changes(fields: Mapping[str, Any]) -> dict[str, Any]:
        """Typed field changes from a mapping of typed values (JSON/YAML), checked by name and
        type (an int for a float field is widened; a list for a tuple field becomes a tuple)."""
        changes: dict[str, Any] = {}
        for key, value in fields.items():
            key = str(key)
            if key not in _FIELD_TYPES:
                close = difflib.get_close_matches(key, list(_FIELD_TYPES), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise StrategyError(f"unknown strategy field {key!r}{hint}")
            changes[key] = _typed(key, value, _FIELD_TYPES[key])
        return changes

    @classmethod
    def from_mapping(cls, fields: Mapping[str, Any], base: "Strategy | None" = None) -> "Strategy":
        """``base`` (default ``Strategy()``) with the typed ``fields`` applied (:meth:`field_changes`)."""
        return (base or cls()).replace(**cls.field_changes(fields))

    @classmethod
    def from_file(cls, path: str | Path) -> "Strategy":
        """A JSON object of Strategy fields (as ``run.json`` records it), checked by :meth:`from_mapping`."""
        path = Path(path)
        try:
            fields = json.loads(path.read_text())
            if not isinstance(fields, dict):
                raise ValueError("expected a JSON object")
        except (OSError, ValueError) as exc:
            raise StrategyError(f"strategy file {path}: {exc}") from None
        try:
            return cls.from_mapping(fields)
        except StrategyError as exc:
            raise StrategyError(f"strategy file {path}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, device: torch.device | str = "cpu") -> "Strategy":
        """Raise :class:`StrategyError` for invalid or inapplicable settings; return self.

        The checks run once per Strategy and device: a Strategy that passed (the planned one,
        :func:`hotloop.compose.plan.plan_strategy`) is trusted afterwards, so the Trainer's,
        ``apply_device_flags``' and ``build_step``'s calls return at once. A changed copy
        (``replace``) is a new Strategy and is checked again.
        """
        device = torch.device(device)
        if self.__dict__.get("_checked_for") == device:
            return self
        self._check(device)
        object.__setattr__(self, "_checked_for", device)   # not a field: equality and to_dict ignore it
        return self

    def _onednn_gemm_blocked(self, device: torch.device) -> str:
        """Why oneDNN cannot serve ``linear_gemm=onednn`` here ("" when it can)."""
        if device.type != "cpu":
            return f"running on {device.type}"
        if not self.onednn:
            return "onednn=False turns it off"
        return "" if torch.backends.mkldnn.is_available() else "this torch is built without oneDNN"

    def _check(self, device: torch.device) -> None:
        """Every check of :meth:`validate` (raises :class:`StrategyError`)."""
        choices = {"backend": ("eager", "graph", "inductor"), "executor": ("serial", "parallel"),
                   "precision": ("fp32", "bf16", "fp16"),
                   "data_parallel": ("none", "allreduce", "reduce", "fsdp")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise StrategyError(f"strategy {name}={getattr(self, name)!r}; choose one of {list(allowed)}")
        for name in ("intra_op_threads", "inter_op_threads", "prefetch", "num_workers"):
            if getattr(self, name) < 0:
                raise StrategyError(f"strategy {name} must be >= 0")
        if self.sync_every < 1:
            raise StrategyError("strategy sync_every must be >= 1")
        if self.bucket_mb <= 0:
            raise StrategyError("strategy bucket_mb must be > 0")
        if self.memory_budget_gb < 0:
            raise StrategyError("strategy memory_budget_gb must be >= 0 (0: the device's memory)")
        _check_sharding(self)
        if device.type != "cuda":
            for name in ("cuda_graphs", "cudnn_benchmark", "tf32"):
                if getattr(self, name):
                    raise StrategyError(f"strategy {name}=True needs a CUDA device (running on {device.type})")
            if self.precision == "fp16":
                raise StrategyError("strategy precision=fp16 needs CUDA (a loss-scaled fp16 step is "
                                    "slower than fp32 on CPU); use precision=bf16")
        if self.executor == "parallel" and self.backend != "graph":
            raise StrategyError("strategy executor=parallel runs captured graphs: set backend=graph")
        if device.type == "cuda" and not self.onednn:
            raise StrategyError("strategy onednn=False applies to CPU only (running on cuda)")
        if self.linear_gemm == "onednn" and (why := self._onednn_gemm_blocked(device)):
            raise StrategyError(f"strategy linear_gemm=onednn needs a CPU with oneDNN ({why})")
        if device.type == "cuda" and self.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise StrategyError("strategy precision=bf16: this CUDA device has no bf16 support; use fp16")
        if self.graph_passes and self.backend != "graph":
            raise StrategyError("strategy graph_passes=True rewrites hotloop's captured graph: "
                                f"set backend=graph (backend is {self.backend!r})")
        if self.inplace and self.backend != "graph":
            raise StrategyError("strategy inplace=True is a rewrite of the captured graph: set backend=graph")
        if self.fast_math and not self.graph_passes:
            raise StrategyError("strategy fast_math=True selects extra graph passes: set graph_passes=True")
        if self.disabled_passes and not self.graph_passes:
            raise StrategyError("strategy disabled_passes is set but graph_passes=False")
        if self.disabled_passes:
            from .passes import PASS_NAMES
            unknown = [p for p in self.disabled_passes if p not in PASS_NAMES]
            if unknown:
                raise StrategyError(f"strategy disabled_passes: unknown pass(es) {unknown}; "
                                    f"known: {list(PASS_NAMES)}")
        try:
            self.formulation.check()
        except FormulationError as exc:
            raise StrategyError(str(exc)) from None
        if self.cuda_graphs and self.backend != "inductor":
            raise StrategyError("strategy cuda_graphs=True is served by torch.compile's "
                                "reduce-overhead mode: set backend=inductor")


def _check_sharding(strategy: Strategy) -> None:
    """FSDP and activation checkpointing run on autograd as written (eager; inductor for checkpointing)."""
    if strategy.data_parallel == "fsdp" and strategy.backend != "eager":
        raise StrategyError(f"strategy data_parallel=fsdp runs with backend=eager (backend is {strategy.backend!r})")
    if strategy.data_parallel == "fsdp" and strategy.precision == "fp16":
        raise StrategyError("strategy data_parallel=fsdp with precision=fp16: use precision=bf16 "
                            "(a loss scaler would see only this rank's gradient shard)")
    if strategy.activation_checkpointing and strategy.backend == "graph":
        raise StrategyError("strategy activation_checkpointing=True runs with backend=eager or inductor")


def _typed(key: str, value: Any, typ: Any) -> Any:
    """``value`` as field ``key`` of type ``typ`` holds it, or :class:`StrategyError`."""
    try:
        return typed_value(key, value, typ, "strategy field")
    except HParamsError as exc:
        raise StrategyError(str(exc)) from None


def validate_for_model(strategy: Strategy, model: torch.nn.Module) -> None:
    """Reject settings that do not apply to ``model`` (sparse gradients, channels_last without convs,
    formulation fields the model does not read; the engine fields are read by every model with a
    site for them: ``dropout_masks`` by an ``nn.Dropout`` module, :mod:`hotloop.engine.dropout_masks`,
    ``dilated_conv_wgrad`` and ``pointwise_conv`` by a dilated and a 1x1 ``nn.Conv2d``,
    :mod:`hotloop.engine.conv_formulations`, ``instance_norm`` by a plain ``nn.InstanceNorm2d``,
    ``batch_norm`` by an ``nn.BatchNorm2d``,
    :mod:`hotloop.engine.norm_formulations`, ``linear_gemm`` by a plain ``nn.Linear`` or
    ``nn.MultiheadAttention``,
    :mod:`hotloop.engine.linear_formulations`)."""
    reads = set(getattr(model, "formulation_fields", ()))
    needs = {"dropout_masks": "an nn.Dropout with p > 0",
             "dilated_conv_wgrad": "a dilated nn.Conv2d (stride 1, one group)",
             "pointwise_conv": "an unpadded 1x1 nn.Conv2d (stride 1, one group)",
             "instance_norm": "an nn.InstanceNorm2d without affine parameters or running statistics",
             "batch_norm": "an nn.BatchNorm2d",
             "linear_gemm": "an nn.Linear or nn.MultiheadAttention"}
    if has_dropout(model):
        reads.add("dropout_masks")
    if dilated_conv_sites(model):
        reads.add("dilated_conv_wgrad")
    if pointwise_conv_sites(model):
        reads.add("pointwise_conv")
    if instance_norm_sites(model):
        reads.add("instance_norm")
    if batch_norm_sites(model):
        reads.add("batch_norm")
    if linear_sites(model) or attention_sites(model):
        reads.add("linear_gemm")
    foreign = sorted(set(strategy.formulation.changed()) - reads)
    if foreign:
        hints = "".join(f"; {field} needs {needs[field]}" for field in foreign if field in needs)
        raise StrategyError(f"strategy {', '.join(foreign)}: {type(model).__name__} does not read "
                            f"{'this formulation field' if len(foreign) == 1 else 'these formulation fields'}"
                            f" (it reads {sorted(reads) or 'none'}{hints})")
    from ..optim import sparse_gradient_modules
    sparse = sparse_gradient_modules(model)
    if sparse and strategy.fused_optimizer:
        raise StrategyError(f"strategy fused_optimizer=True cannot update sparse gradients "
                            f"(from {', '.join(sparse[:3])}); set fused_optimizer=False or use "
                            "dense embeddings")
    if strategy.channels_last and not any(
            isinstance(m, torch.nn.Conv2d) for m in model.modules()):
        raise StrategyError("strategy channels_last=True applies to 2-D convolutions; "
                            f"{type(model).__name__} has none")


#: field name -> its type (``Strategy``'s annotations, resolved)
_FIELD_TYPES: dict[str, Any] = {f.name: typing.get_type_hints(Strategy)[f.name]
                                for f in dataclasses.fields(Strategy)}
