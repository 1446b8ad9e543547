"""``Strategy.dilated_conv_wgrad`` and ``Strategy.pointwise_conv`` for any model's ``nn.Conv2d``.

:func:`use_conv_formulations` (called by ``build_step``) makes each eligible ``nn.Conv2d`` of the
model (exactly that type, stride 1, one group, zero padding given as numbers) a
:class:`FormulatedConv2d`: the same module, parameters, hooks and ``state_dict``, whose
convolution follows the Strategy:

- a **dilated** convolution (dilation above 1) takes its weight gradient per ``dilated_conv_wgrad``
  (:func:`hotloop.ops.dilated_conv.dilated_conv2d`; ``"taps"``: per-tap GEMMs over the valid
  positions where the map is small);
- a **pointwise** convolution (1x1, unpadded) runs per ``pointwise_conv``
  (:func:`hotloop.ops.pointwise_conv.pointwise_conv2d`; ``"gemm"``: one GEMM for small calls).

With both fields ``"aten"`` the modules are ``nn.Conv2d`` again (a model never built otherwise
is left untouched).
"""
from __future__ import annotations

from torch import Tensor, nn

from ..models.formulation import POINTWISE_GEMM_OPTION, TAPS_OPTION, Formulation, FormulationOption, sites_text
from ..ops.dilated_conv import dilated_conv2d
from ..ops.pointwise_conv import pointwise_conv2d

__all__ = ["FormulatedConv2d", "use_conv_formulations", "dilated_conv_sites", "pointwise_conv_sites",
           "conv_formulation_options"]


class FormulatedConv2d(nn.Conv2d):
    """``nn.Conv2d`` computed per its ``wgrad`` (dilated) or ``pointwise`` (1x1) formulation (module doc)."""

    wgrad = "aten"
    pointwise = "aten"

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self.kernel_size == (1, 1):
            return pointwise_conv2d(input, weight, bias, self.pointwise)
        return dilated_conv2d(input, weight, bias, self.stride, self.padding, self.dilation,  # type: ignore[arg-type]
                              self.groups, self.wgrad)


def _plain_eligible(module: nn.Module) -> bool:
    return (type(module) in (nn.Conv2d, FormulatedConv2d) and tuple(module.stride) == (1, 1)
            and module.groups == 1 and module.padding_mode == "zeros" and not isinstance(module.padding, str))


def dilated_conv_sites(model: nn.Module) -> list[nn.Conv2d]:
    """The distinct dilated convolutions of ``model`` that ``dilated_conv_wgrad`` applies to."""
    return [m for m in model.modules() if _plain_eligible(m) and max(m.dilation) > 1 and m.kernel_size != (1, 1)]


def pointwise_conv_sites(model: nn.Module) -> list[nn.Conv2d]:
    """The distinct unpadded 1x1 convolutions of ``model`` that ``pointwise_conv`` applies to."""
    return [m for m in model.modules()
            if _plain_eligible(m) and m.kernel_size == (1, 1) and tuple(m.padding) == (0, 0)]


def use_conv_formulations(model: nn.Module, wgrad: str = "aten", pointwise: str = "aten") -> list[str]:
    """Give ``model``'s dilated convolutions the weight gradient ``wgrad`` and its 1x1 ones the
    formulation ``pointwise``; the step's report lines (an unknown value: ``FormulationError``)."""
    Formulation(dilated_conv_wgrad=wgrad, pointwise_conv=pointwise).check()
    report = []
    for sites, field, value in ((dilated_conv_sites(model), "wgrad", wgrad),
                                (pointwise_conv_sites(model), "pointwise", pointwise)):
        for conv in sites:                # the class only: parameters, buffers and hooks stay the module's
            if value != "aten":
                conv.__class__ = FormulatedConv2d
                setattr(conv, field, value)
            elif type(conv) is FormulatedConv2d:
                conv.__class__ = nn.Conv2d
                conv.__dict__.pop(field, None)
        if value != "aten" and sites:
            what = "dilated conv weight gradient" if field == "wgrad" else "1x1 convs"
            report.append(f"{what}: {value} in {sites_text(len(sites), 'nn.Conv2d')}")
    return report


def conv_formulation_options(model: nn.Module) -> list[FormulationOption]:
    """:data:`TAPS_OPTION` for a model with dilated convolutions, :data:`POINTWISE_GEMM_OPTION` for
    one with 1x1 convolutions (the sites counted in each option's reason)."""
    options = []
    for sites, option in ((dilated_conv_sites(model), TAPS_OPTION), (pointwise_conv_sites(model),
                                                                     POINTWISE_GEMM_OPTION)):
        if sites:
            options.append(option.at_sites(len(sites), "nn.Conv2d"))
    return options
