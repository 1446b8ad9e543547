"""Output projection + log-softmax + cross-entropy fused, chunk by chunk.

``linear_cross_entropy(hidden, weight, bias, targets)`` returns the *summed*
token NLL of ``log_softmax(hidden @ weight.T + bias)`` without ever holding
the full ``[tokens, vocab]`` fp32 logits: rows are processed ``chunk_rows`` at
a time. When a gradient is needed, the gradient of the sum is computed in the
same pass (softmax minus one-hot, then two GEMMs), so backward is only a
scalar rescale: no logits are saved and none are recomputed.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linear_cross_entropy", "DEFAULT_CHUNK_ROWS"]

DEFAULT_CHUNK_ROWS = 256


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed NLL; saves the (unit) gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                ignore_index: int, chunk_rows: int, with_grad: bool,
                gemm_dtype: torch.dtype | None) -> Tensor:
        # hidden [N, H], weight [V, H], bias [V] | None, targets [N] int64
        n = hidden.shape[0]
        low = gemm_dtype is not None and gemm_dtype != weight.dtype
        w_gemm = weight.to(gemm_dtype) if low else weight                  # [V, H]
        h_gemm = hidden.to(gemm_dtype) if low else hidden                  # [N, H]
        total = hidden.new_zeros(())
        grad_hidden = torch.empty_like(hidden) if with_grad else None
        grad_weight = torch.zeros_like(weight) if with_grad else None
        grad_bias = torch.zeros_like(bias) if (with_grad and bias is not None) else None
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            h = h_gemm[start:stop]                                        # [n, H]
            tgt = targets[start:stop]                                     # [n]
            if low:
                logits = torch.mm(h, w_gemm.t()).float()                  # [n, V] fp32
                if bias is not None:
                    logits += bias
            else:
                logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())  # [n, V]
            row_max = logits.amax(dim=1, keepdim=True)                    # [n, 1]
            logits.sub_(row_max)
            valid = tgt != ignore_index if ignore_index >= 0 else None
            safe_tgt = tgt.clamp(min=0) if valid is not None else tgt
            target_logit = logits.gather(1, safe_tgt[:, None]).squeeze(1)  # [n], shifted
            probs = logits.exp_()                                         # [n, V] unnormalised
            sum_exp = probs.sum(dim=1)                                    # [n]
            nll = sum_exp.log() - target_logit                            # [n]
            if valid is not None:
                nll = nll * valid
            total += nll.sum()
            if with_grad:
                probs.div_(sum_exp[:, None])                              # softmax
                probs.scatter_add_(1, safe_tgt[:, None],
                                   probs.new_full((stop - start, 1), -1.0))  # softmax - onehot
                if valid is not None:
                    probs.mul_(valid[:, None])
                if grad_bias is not None:
                    grad_bias += probs.sum(dim=0)
                if low:
                    probs = probs.to(gemm_dtype)
                    grad_hidden[start:stop] = torch.mm(probs, w_gemm)         # [n, H]
                    grad_weight += torch.mm(probs.t(), h)                     # [V, H]
                else:
                    torch.mm(probs, weight, out=grad_hidden[start:stop])   # [n, H]
                    grad_weight.addmm_(probs.t(), h)                      # [V, H]
        if with_grad:
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.has_bias = bias is not None
        return total

    @staticmethod
    def backward(ctx, grad_total: Tensor):  # type: ignore[override]
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_total
        gb = grad_bias * scale if ctx.has_bias else None
        return grad_hidden * scale, grad_weight * scale, gb, None, None, None, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                         ignore_index: int = -1, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                         gemm_dtype: torch.dtype | None = None) -> Tensor:
    """Summed cross-entropy of ``hidden @ weight.T + bias`` against ``targets``.

    hidden [N, H]; weight [V, H]; bias [V] or None; targets [N]. Rows whose
    target equals ``ignore_index`` (when >= 0) count zero. Returns a scalar.
    Runs in the weight's dtype (autocast is disabled inside; bf16 hidden is cast up).
    ``gemm_dtype=torch.bfloat16`` runs the three GEMMs on bf16 operands (the
    softmax, the loss and the gradient accumulation stay fp32): about 2x faster
    on CPUs with AVX512-BF16, with bf16 rounding of logits and gradients.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: hidden must be [N, H] and targets [N], "
                         f"got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    with_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        hidden = hidden.to(weight.dtype)
        return _LinearCrossEntropy.apply(hidden.contiguous(), weight, bias, targets.contiguous(),
                                         ignore_index, chunk_rows, with_grad, gemm_dtype)
