"""How a model computes its math, never what it computes: the formulation knobs.

A paper reports a model's hparams (sizes, dropout rate, learning rate, clipping
norm). How the same function is evaluated (which LSTM kernel, whether the output
projection and cross-entropy are chunked, the operand dtype of their GEMMs, how
dropout masks are drawn, how RoIAlign pools, how a dilated convolution's weight gradient is
summed, whether a 1x1 convolution is a GEMM, how a squeeze-excitation gate's backward runs, how an
instance or batch norm of a channels-last map is computed, which library's GEMMs a linear layer calls) is a
speed choice: it belongs to the Strategy, where ``--strategy auto`` times it on the machine at hand
and the parity guard checks it. :class:`Formulation` is the typed view of those Strategy fields that a model
reads; the plain fp32 formulation is its default.

A model names the fields it reads (``SequenceModel.formulation_fields``) and the
alternatives worth timing (``SequenceModel.formulation_options``, data the tuner
filters by hardware).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import UserError
from ..ops.batch_norm import BATCH_NORMS
from ..ops.dilated_conv import DILATED_CONV_WGRADS
from ..ops.dropout import DROPOUT_MASKS
from ..ops.instance_norm import INSTANCE_NORMS
from ..ops.linear_gemm import LINEAR_GEMMS
from ..ops.pointwise_conv import POINTWISE_CONVS
from ..ops.roi_align import ROI_ALIGN_FORMULATIONS
from ..ops.squeeze_excite import SE_BACKWARDS
from .lstm_cells import LSTM_IMPLS

__all__ = ["Formulation", "FormulationOption", "FormulationError", "FORMULATION_FIELDS",
           "FORMULATION_CHOICES", "GEMM_DTYPES", "ROUNDING", "ENGINE_FIELDS", "RANDOM_STREAM_FIELDS",
           "BITS16_OPTION", "FUSED_CE_OPTIONS", "TAPS_OPTION",
           "POINTWISE_GEMM_OPTION", "SE_FUSED_OPTION", "INSTANCE_NORM_OPTION", "BATCH_NORM_OPTION",
           "ONEDNN_LINEAR_OPTION", "sites_text"]

#: accepted values of the string fields
GEMM_DTYPES = ("fp32", "bf16")
FORMULATION_CHOICES: dict[str, tuple[str, ...]] = {
    "lstm_impl": tuple(LSTM_IMPLS),
    "lstm_gemm_dtype": GEMM_DTYPES,
    "ce_gemm_dtype": GEMM_DTYPES,
    "dropout_masks": tuple(DROPOUT_MASKS),
    "roi_align_impl": ROI_ALIGN_FORMULATIONS,
    "dilated_conv_wgrad": DILATED_CONV_WGRADS,
    "pointwise_conv": POINTWISE_CONVS,
    "se_backward": SE_BACKWARDS,
    "instance_norm": INSTANCE_NORMS,
    "batch_norm": BATCH_NORMS,
    "linear_gemm": LINEAR_GEMMS,
}

#: how an option changes the numbers: "fp32" (other fp32 rounding), "bf16" (bf16 GEMM
#: operands, fp32 accumulation), "random_stream" (other random draws, same distribution)
ROUNDING = ("fp32", "bf16", "random_stream")

#: fields the engine applies to any model besides the models that read them (``dropout_masks``:
#: every ``nn.Dropout`` module, :mod:`hotloop.engine.dropout_masks`; ``dilated_conv_wgrad`` and
#: ``pointwise_conv``: dilated and 1x1 ``nn.Conv2d``, :mod:`hotloop.engine.conv_formulations`;
#: ``instance_norm`` and ``batch_norm``: plain ``nn.InstanceNorm2d`` and ``nn.BatchNorm2d``,
#: :mod:`hotloop.engine.norm_formulations`;
#: ``linear_gemm``: plain ``nn.Linear``, :mod:`hotloop.engine.linear_formulations`)
ENGINE_FIELDS = ("dropout_masks", "dilated_conv_wgrad", "pointwise_conv", "instance_norm", "batch_norm",
                 "linear_gemm")
#: fields whose other values draw other random numbers (same distribution)
RANDOM_STREAM_FIELDS = ("dropout_masks",)


class FormulationError(UserError, ValueError):
    """A formulation value that is unknown, or does not fit the model."""


@dataclass(frozen=True)
class Formulation:
    """The formulation fields of a Strategy (defaults: the plain fp32 formulation)."""

    lstm_impl: str = "fused"          # "fused" (nn.LSTM) | "unrolled" | "hoisted" | "bptt"
    lstm_gemm_dtype: str = "fp32"     # GEMM operand dtype of lstm_impl=bptt (changes rounding)
    fused_ce: bool = False            # chunked output projection + cross-entropy (fp32 rounding)
    ce_chunk_rows: int = 0            # rows of logits live at once in fused_ce (0: its default)
    ce_gemm_dtype: str = "fp32"       # operand dtype of the fused_ce GEMMs (changes rounding)
    dropout_masks: str = "bernoulli"  # "bernoulli" (F.dropout) | "bits16" (other random draws)
    roi_align_impl: str = "gather"    # RoIAlign: "gather" (4 neighbours per sample) | "separable" (GEMMs)
    dilated_conv_wgrad: str = "aten"  # dilated convs' weight gradient: "aten" | "taps" (per-tap GEMMs)
    pointwise_conv: str = "aten"      # 1x1 convs: "aten" | "gemm" (one GEMM for small calls)
    se_backward: str = "aten"         # squeeze-excitation gate's backward: "aten" | "fused" (fewer map passes)
    instance_norm: str = "aten"       # instance norms: "aten" | "per_sample" (channels-last, no layout copies)
    batch_norm: str = "aten"          # batch norms: "aten" | "two_pass" (channels-last statistics in two passes)
    linear_gemm: str = "aten"         # nn.Linear GEMMs: "aten" (the BLAS) | "onednn" (CPU; fp32 reordering)

    def check(self) -> "Formulation":
        """Raise :class:`FormulationError` for an unknown value or combination; return self."""
        for name, allowed in FORMULATION_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise FormulationError(f"strategy {name}={getattr(self, name)!r}; choose one of {list(allowed)}")
        if self.ce_chunk_rows < 0:
            raise FormulationError("strategy ce_chunk_rows must be >= 0")
        if self.lstm_gemm_dtype != "fp32" and self.lstm_impl != "bptt":
            raise FormulationError(f"strategy lstm_gemm_dtype={self.lstm_gemm_dtype} needs lstm_impl=bptt "
                                   f"(got lstm_impl={self.lstm_impl}); for nn.LSTM use precision=bf16")
        if self.ce_gemm_dtype != "fp32" and not self.fused_ce:
            raise FormulationError(f"strategy ce_gemm_dtype={self.ce_gemm_dtype} is an operand dtype of the "
                                   "fused output+cross-entropy: set fused_ce=True")
        return self

    def changed(self) -> dict[str, Any]:
        """The fields that differ from the plain formulation."""
        plain = Formulation()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(plain, f.name)}

    @property
    def bf16_gemms(self) -> bool:
        """Whether some GEMM runs with bf16 operands."""
        return "bf16" in (self.lstm_gemm_dtype, self.ce_gemm_dtype)


FORMULATION_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Formulation))


@dataclass(frozen=True)
class FormulationOption:
    """An alternative formulation a model offers to the tuner (applied on top of the plain one)."""

    label: str
    changes: dict[str, Any]           # Formulation fields
    why: str                          # what it changes, for the tune table
    rounding: str = "fp32"            # one of ROUNDING
    needs_fast_bf16: bool = False     # proposed only where bf16 GEMMs are faster than fp32
    cpu_only: bool = False            # proposed only for a step on a CPU
    expected_gain: float = 0.1        # prior used only to order the trials
    #: Strategy settings the option is timed with: the layout its kernels are written for
    timed_with: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def at_sites(self, count: int, module: str) -> "FormulationOption":
        """A copy of this engine option whose reason counts the model's sites for it."""
        return self.with_sites(sites_text(count, module))

    def with_sites(self, sites: str) -> "FormulationOption":
        """A copy of this engine option whose reason ends with ``sites`` (the model's sites for it)."""
        return dataclasses.replace(self, changes=dict(self.changes), why=f"{self.why} ({sites})")


def sites_text(count: int, module: str) -> str:
    """``"3 nn.Conv2d modules"``: how option reasons and step report lines count a formulation's sites."""
    return f"{count} {module} module{'s' * (count != 1)}"


#: every dropout mask from 16-bit draws: another random stream, the same drop rate (the parity
#: guard's random-stream rule confirms it); offered by models with dropout and by the engine
#: for models with ``nn.Dropout`` modules (:mod:`hotloop.engine.dropout_masks`)
BITS16_OPTION = FormulationOption("dropout_masks=bits16", {"dropout_masks": "bits16"},
                                  "dropout masks from 16-bit integer draws (a quarter of the random draws)",
                                  rounding="random_stream", expected_gain=0.1)

#: the fused output projection + cross-entropy, in fp32 and with bf16 GEMM operands: offered by
#: models whose loss is a token cross-entropy over a vocabulary-sized output layer
FUSED_CE_OPTIONS = (
    FormulationOption("fused_ce", {"fused_ce": True},
                      "chunked output projection + cross-entropy (no [tokens, V] logits kept)",
                      expected_gain=0.3),
    FormulationOption("fused_ce bf16", {"fused_ce": True, "ce_gemm_dtype": "bf16"},
                      "fused output+CE with bf16 GEMM operands (fp32 softmax sums and gradients)",
                      rounding="bf16", needs_fast_bf16=True, expected_gain=0.5))

#: the weight gradient of dilated convolutions from per-tap GEMMs over the positions inside the map
#: (:mod:`hotloop.ops.dilated_conv`), and small 1x1 convolution calls as one GEMM
#: (:mod:`hotloop.ops.pointwise_conv`): offered by the engine for models with such ``nn.Conv2d``
TAPS_OPTION = FormulationOption("dilated_conv_wgrad=taps", {"dilated_conv_wgrad": "taps"},
                                "dilated convs' weight gradient as one GEMM per tap over the valid positions",
                                expected_gain=0.05)
POINTWISE_GEMM_OPTION = FormulationOption("pointwise_conv=gemm", {"pointwise_conv": "gemm"},
                                          "small 1x1 conv calls as one GEMM over channels-last maps",
                                          expected_gain=0.05, timed_with={"channels_last": True})

#: the squeeze-excitation gate's backward with fewer passes over map-sized tensors, the same numbers
#: (:mod:`hotloop.ops.squeeze_excite`): offered by models with squeeze-excitation gates (SE-ResNeXt)
SE_FUSED_OPTION = FormulationOption("se_backward=fused", {"se_backward": "fused"},
                                    "squeeze-excitation backward: g*s written once, the mean's gradient "
                                    "added in place",
                                    expected_gain=0.05)


#: instance norms of channels-last maps as per-sample batch norms, without the copies to NCHW and
#: back that ``F.instance_norm`` makes (:mod:`hotloop.ops.instance_norm`): offered by the engine for
#: models with plain ``nn.InstanceNorm2d`` (CycleGAN)
INSTANCE_NORM_OPTION = FormulationOption("instance_norm=per_sample", {"instance_norm": "per_sample"},
                                         "instance norms of channels-last maps per sample, no layout copies",
                                         expected_gain=0.05, timed_with={"channels_last": True})

#: batch norms of channels-last maps with statistics summed in two passes, as accurate as the NCHW
#: kernel (:mod:`hotloop.ops.batch_norm`): offered by the engine, on a CPU, for models with
#: ``nn.BatchNorm2d`` (SE-ResNeXt, DeepLabV3+, YOLOv3)
BATCH_NORM_OPTION = FormulationOption("batch_norm=two_pass", {"batch_norm": "two_pass"},
                                      "batch norms of channels-last maps with two-pass statistics",
                                      cpu_only=True, expected_gain=0.05, timed_with={"channels_last": True})


#: every plain ``nn.Linear``'s three GEMMs from oneDNN's kernels instead of the BLAS's
#: (:mod:`hotloop.ops.linear_gemm`): offered by the engine, on a CPU, for models with such layers
ONEDNN_LINEAR_OPTION = FormulationOption("linear_gemm=onednn", {"linear_gemm": "onednn"},
                                         "linear layers' GEMMs from oneDNN's kernels instead of the BLAS's",
                                         cpu_only=True, expected_gain=0.2)
