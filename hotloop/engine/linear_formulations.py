"""``Strategy.linear_gemm`` for any model's ``nn.Linear``.

:func:`use_linear_gemm` (called by ``build_step``) makes each ``nn.Linear`` of the model (exactly
that type) a :class:`FormulatedLinear`: the same module, parameters, hooks and ``state_dict``,
whose forward and backward GEMMs run per :func:`hotloop.ops.linear_gemm.linear` (``"onednn"``:
oneDNN's kernels instead of the BLAS's, on a CPU). Subclasses of ``nn.Linear`` keep their own
forward, and projections a module makes with ``F.linear`` on its own weights
(``nn.MultiheadAttention``'s) stay the BLAS's. With ``"aten"`` the modules are ``nn.Linear`` again.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..models.formulation import ONEDNN_LINEAR_OPTION, Formulation, FormulationOption, sites_text
from ..ops.linear_gemm import linear

__all__ = ["FormulatedLinear", "use_linear_gemm", "linear_sites", "linear_gemm_options"]


class FormulatedLinear(nn.Linear):
    """``nn.Linear`` whose GEMMs follow its ``gemm`` (module doc)."""

    gemm = "aten"

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias, self.gemm)


def linear_sites(model: nn.Module) -> list[nn.Linear]:
    """The distinct ``nn.Linear`` modules of ``model`` (exactly that type) that ``linear_gemm`` applies to."""
    return [m for m in model.modules() if type(m) in (nn.Linear, FormulatedLinear)]


def use_linear_gemm(model: nn.Module, gemm: str = "aten") -> list[str]:
    """Give ``model``'s linear layers the GEMMs ``gemm``; the step's report lines (an unknown
    value: ``FormulationError``)."""
    Formulation(linear_gemm=gemm).check()
    sites = linear_sites(model)
    for layer in sites:                 # the class only: parameters, buffers and hooks stay the module's
        if gemm != "aten":
            layer.__class__ = FormulatedLinear
            layer.gemm = gemm
        elif type(layer) is FormulatedLinear:
            layer.__class__ = nn.Linear
            layer.__dict__.pop("gemm", None)
    if gemm == "aten" or not sites:
        return []
    return [f"linear layers: {gemm} GEMMs in {sites_text(len(sites), 'nn.Linear')}"]


def linear_gemm_options(model: nn.Module) -> list[FormulationOption]:
    """:data:`ONEDNN_LINEAR_OPTION` for a model with linear layers (their count in its reason)."""
    sites = linear_sites(model)
    return [ONEDNN_LINEAR_OPTION.at_sites(len(sites), "nn.Linear")] if sites else []
