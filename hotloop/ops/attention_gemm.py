"""``nn.MultiheadAttention``'s projections through :func:`hotloop.ops.linear_gemm.linear`.

``F.multi_head_attention_forward`` computes its input and output projections with ``F.linear``
on the module's own weights, so a layer swap does not reach them. :func:`attention` is the
same function for the calls a training step makes (batched inputs, one packed input projection,
no ``bias_k``/``bias_v`` or zero attention, no attention weights returned): the masks are
made as torch makes them, the heads attend through ``F.scaled_dot_product_attention`` with the
same arguments (its dropout draws the same numbers), and each projection is
``linear(..., gemm)``. The projections run on batch-first rows, so no input is copied to
sequence-first order.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .linear_gemm import linear

__all__ = ["attention"]


def attention(query: Tensor, key: Tensor, value: Tensor, *, num_heads: int, in_proj_weight: Tensor,
              in_proj_bias: Tensor | None, out_proj_weight: Tensor, out_proj_bias: Tensor | None,
              dropout_p: float, key_padding_mask: Tensor | None, attn_mask: Tensor | None, is_causal: bool,
              gemm: str) -> Tensor:
    """Multi-head attention of batch-first ``query`` [B, T, E] over ``key`` and ``value`` [B, S, E]
    (``key is value`` and ``query is key`` select the packed projections, as in torch) -> [B, T, E].

    ``dropout_p`` is the rate in force (0 outside training); ``is_causal`` needs ``attn_mask``,
    as in ``F.multi_head_attention_forward``."""
    bsz, tgt_len, embed = query.shape
    src_len = key.shape[1]
    head_dim = embed // num_heads
    key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                         other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                         target_type=query.dtype)
    if is_causal and key_padding_mask is None:
        attn_mask = None                                       # SDPA takes the causal hint alone
    else:
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    q, k, v = _projections(query, key, value, in_proj_weight, in_proj_bias, gemm)   # [B, T|S, E] each
    if attn_mask is not None:                                  # [T, S] | [B*H, T, S] -> broadcast to [B, H, T, S]
        attn_mask = attn_mask.view(1, 1, tgt_len, src_len) if attn_mask.dim() == 2 else \
            attn_mask.view(bsz, num_heads, tgt_len, src_len)
    if key_padding_mask is not None:                           # [B, S] -> [B, 1, 1, S]
        padding = key_padding_mask.view(bsz, 1, 1, src_len)
        attn_mask = padding if attn_mask is None else attn_mask + padding
    heads = [t.view(bsz, -1, num_heads, head_dim).transpose(1, 2) for t in (q, k, v)]  # [B, H, T|S, d]
    out = F.scaled_dot_product_attention(*heads, attn_mask, dropout_p, is_causal)    # [B, H, T, d]
    out = out.transpose(1, 2).reshape(bsz, tgt_len, embed)                           # [B, T, E]
    return linear(out, out_proj_weight, out_proj_bias, gemm)


def _projections(query: Tensor, key: Tensor, value: Tensor, weight: Tensor, bias: Tensor | None,
                 gemm: str) -> tuple[Tensor, Tensor, Tensor]:
    """The packed input projection of ``F.multi_head_attention_forward``: one GEMM for
    self-attention, two when key and value are one tensor, else three."""
    embed = query.shape[-1]
    if key is value and query is key:
        return linear(query, weight, bias, gemm).split(embed, dim=-1)              # [B, T, 3E] -> 3 x [B, T, E]
    w_q, w_k, w_v = weight.split(embed)
    b_q, b_k, b_v = bias.split(embed) if bias is not None else (None, None, None)
    q = linear(query, w_q, b_q, gemm)
    if key is value:
        k, v = linear(key, weight[embed:], bias[embed:] if bias is not None else None, gemm).split(embed, dim=-1)
        return q, k, v
    return q, linear(key, w_k, b_k, gemm), linear(value, w_v, b_v, gemm)
