"""``Strategy.linear_gemm`` for any model's ``nn.Linear`` and ``nn.MultiheadAttention``.

:func:`use_linear_gemm` (called by ``build_step``) makes each ``nn.Linear`` of the model (exactly
that type) a :class:`FormulatedLinear` and each ``nn.MultiheadAttention`` a
:class:`FormulatedMultiheadAttention`: the same modules, parameters, hooks and ``state_dict``,
whose GEMMs (forward and backward) run per :func:`hotloop.ops.linear_gemm.linear`
(``"onednn"``: oneDNN's kernels instead of the BLAS's, on a CPU). An attention module takes that
path for the calls :func:`hotloop.ops.attention_gemm.attention` computes, while gradients are
recorded; other calls (attention weights asked for, inference, unbatched inputs) run torch's own
forward. Subclasses of either module keep their own forward. With ``"aten"`` the modules are
torch's again.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..models.formulation import ONEDNN_LINEAR_OPTION, Formulation, FormulationOption, sites_text
from ..ops.attention_gemm import attention
from ..ops.linear_gemm import linear, onednn_serves

__all__ = ["FormulatedLinear", "FormulatedMultiheadAttention", "use_linear_gemm", "linear_sites",
           "attention_sites", "linear_gemm_options"]


class FormulatedLinear(nn.Linear):
    """``nn.Linear`` whose GEMMs follow its ``gemm`` (module doc)."""

    gemm = "aten"

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias, self.gemm)


class FormulatedMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose projections' GEMMs follow its ``gemm`` (module doc)."""

    gemm = "aten"

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        plain: dict[str, Any] = dict(key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
                                     average_attn_weights=average_attn_weights, is_causal=is_causal)
        if not self._formulated(query, key, need_weights, attn_mask, is_causal):
            return super().forward(query, key, value, **plain)
        if not self.batch_first:        # [T, B, E] -> [B, T, E], keeping which inputs are one tensor
            same_kv, same_qk = key is value, query is key
            query = query.transpose(0, 1)
            key = query if same_qk else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        out = attention(query, key, value, num_heads=self.num_heads, in_proj_weight=self.in_proj_weight,
                        in_proj_bias=self.in_proj_bias, out_proj_weight=self.out_proj.weight,
                        out_proj_bias=self.out_proj.bias, dropout_p=self.dropout if self.training else 0.0,
                        key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal,
                        gemm=self.gemm)                                            # [B, T, E]
        return (out if self.batch_first else out.transpose(0, 1)), None

    def _formulated(self, query: Tensor, key: Tensor, need_weights: bool, attn_mask: Tensor | None,
                    is_causal: bool) -> bool:
        """Whether this call is one :func:`attention` computes (module doc)."""
        return (self.gemm != "aten" and torch.is_grad_enabled() and not need_weights and query.dim() == 3
                and self._qkv_same_embed_dim and self.bias_k is None and not self.add_zero_attn
                and key.shape[-1] == self.embed_dim and not (is_causal and attn_mask is None)
                and onednn_serves(query, self.in_proj_weight))


def linear_sites(model: nn.Module) -> list[nn.Linear]:
    """The distinct ``nn.Linear`` modules of ``model`` (exactly that type) that ``linear_gemm`` applies to."""
    return [m for m in model.modules() if type(m) in (nn.Linear, FormulatedLinear)]


def attention_sites(model: nn.Module) -> list[nn.MultiheadAttention]:
    """The distinct ``nn.MultiheadAttention`` modules of ``model`` (exactly that type) ``linear_gemm`` applies to."""
    return [m for m in model.modules() if type(m) in (nn.MultiheadAttention, FormulatedMultiheadAttention)]


def use_linear_gemm(model: nn.Module, gemm: str = "aten") -> list[str]:
    """Give ``model``'s linear layers and attention projections the GEMMs ``gemm``; the step's
    report lines (an unknown value: ``FormulationError``)."""
    Formulation(linear_gemm=gemm).check()
    layers, attentions = linear_sites(model), attention_sites(model)
    for sites, torch_type, formulated in ((layers, nn.Linear, FormulatedLinear),
                                          (attentions, nn.MultiheadAttention, FormulatedMultiheadAttention)):
        for module in sites:            # the class only: parameters, buffers and hooks stay the module's
            if gemm != "aten":
                module.__class__ = formulated
                module.gemm = gemm
            elif type(module) is formulated:
                module.__class__ = torch_type
                module.__dict__.pop("gemm", None)
    if gemm == "aten" or not (layers or attentions):
        return []
    return [f"linear layers: {gemm} GEMMs in {_sites(layers, attentions)}"]


def linear_gemm_options(model: nn.Module) -> list[FormulationOption]:
    """:data:`ONEDNN_LINEAR_OPTION` for a model with linear layers or attention modules (counted in its reason)."""
    layers, attentions = linear_sites(model), attention_sites(model)
    if not (layers or attentions):
        return []
    return [ONEDNN_LINEAR_OPTION.with_sites(_sites(layers, attentions))]


def _sites(layers: list[nn.Linear], attentions: list[nn.MultiheadAttention]) -> str:
    """``"3 nn.Linear modules and 2 nn.MultiheadAttention modules"``."""
    parts = [sites_text(len(layers), "nn.Linear")] if layers else []
    return " and ".join(parts + ([sites_text(len(attentions), "nn.MultiheadAttention")] if attentions else []))
