"""Output projection + log-softmax + cross-entropy fused, chunk by chunk.

``linear_cross_entropy(hidden, weight, bias, targets)`` returns the *summed*
token NLL of ``log_softmax(hidden @ weight.T + bias)`` without ever holding
the full ``[tokens, vocab]`` fp32 logits: rows are processed ``chunk_rows`` at
a time. When a gradient is needed, the gradient of the sum is computed in the
same pass (softmax minus the target distribution, then two GEMMs), so backward
is only a scalar rescale: no logits are saved and none are recomputed.
``linear_token_loss`` gives the label-smoothed sum (``F.cross_entropy``'s
``label_smoothing``: target distribution ``(1-e) onehot + e/V``) and the plain
NLL sum from the same pass.

Two paths compute the same function:

- fp32 (``gemm_dtype=None``): ``chunk_rows`` rows at a time, fp32 logits,
  bitwise the reference math up to summation order. ``linear_gemm="onednn"`` computes
  its three GEMMs with oneDNN's kernels on a CPU (:mod:`hotloop.ops.linear_gemm`), in
  chunks of :data:`ONEDNN_CHUNK_ROWS` rows by default (oneDNN's kernels gain on taller
  operands; the weight gradient is summed over the chunks).
- bf16 operands (``gemm_dtype=torch.bfloat16``): the bias rides in the GEMM as
  an extra column (``[W | b]`` against ``[h | 1]``), so one GEMM gives logits
  with bias, and one GEMM gives both the weight and the bias gradient. The
  softmax runs in place on the logits (ATen's last-dimension kernel: one
  pass for the max, one exponentiating pass that also sums in fp32, one
  scaling pass), reading and writing bf16. Blocks of up to
  ``chunk_rows`` rows keep their bf16 probabilities, so the two gradient
  GEMMs run once per block instead of once per small chunk.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..ops.linear_gemm import linear, linear_grads, onednn_serves

__all__ = ["linear_cross_entropy", "linear_token_loss", "DEFAULT_CHUNK_ROWS", "ONEDNN_CHUNK_ROWS",
           "DEFAULT_LOW_BLOCK_BYTES"]

DEFAULT_CHUNK_ROWS = 256                # fp32 path: rows of fp32 logits live at once
ONEDNN_CHUNK_ROWS = 1024                # fp32 path with oneDNN's GEMMs: rows of fp32 logits live at once
DEFAULT_LOW_BLOCK_BYTES = 64 << 20      # bf16 path: bytes of bf16 probabilities per block


Grads = tuple[Tensor | None, Tensor | None, Tensor | None]


def _fp32_pass(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, ignore_index: int,
               chunk_rows: int, with_grad: bool, smoothing: float,
               onednn: bool = False) -> tuple[Tensor, Tensor, Grads]:
    """Summed smoothed loss and NLL (and unit gradients of the loss) in the weight's dtype,
    ``chunk_rows`` rows at a time; the GEMMs from oneDNN when ``onednn``."""
    # hidden [N, H], weight [V, H], bias [V] | None, targets [N] int64
    n, vocab = hidden.shape[0], weight.shape[0]
    total = hidden.new_zeros(())
    total_nll = hidden.new_zeros(())
    grad_hidden = torch.empty_like(hidden) if with_grad else None
    grad_weight = torch.zeros_like(weight) if with_grad else None
    grad_bias = torch.zeros_like(bias) if (with_grad and bias is not None) else None
    for start in range(0, n, chunk_rows):
        stop = min(start + chunk_rows, n)
        h = hidden[start:stop]                                            # [n, H]
        tgt = targets[start:stop]                                         # [n]
        if onednn:
            logits = linear(h, weight, bias, "onednn")                    # [n, V]
        else:
            logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())  # [n, V]
        row_max = logits.amax(dim=1, keepdim=True)                        # [n, 1]
        logits.sub_(row_max)
        valid = tgt != ignore_index if ignore_index >= 0 else None
        safe_tgt = tgt.clamp(min=0) if valid is not None else tgt
        target_logit = logits.gather(1, safe_tgt[:, None]).squeeze(1)     # [n], shifted
        mean_logit = logits.mean(dim=1) if smoothing else None            # [n], shifted
        probs = logits.exp_()                                             # [n, V] unnormalised
        sum_exp = probs.sum(dim=1)                                        # [n]
        log_sum = sum_exp.log()                                           # [n] logsumexp, shifted
        nll = log_sum - target_logit                                      # [n]
        loss = nll if mean_logit is None else (1 - smoothing) * nll + smoothing * (log_sum - mean_logit)
        if valid is not None:
            nll, loss = nll * valid, loss * valid
        nll_sum = nll.sum()
        total_nll += nll_sum
        total += loss.sum() if smoothing else nll_sum
        if with_grad:
            probs.div_(sum_exp[:, None])                                  # softmax
            if smoothing:
                probs.sub_(smoothing / vocab)
            probs.scatter_add_(1, safe_tgt[:, None], probs.new_full((stop - start, 1), smoothing - 1.0))
            if valid is not None:
                probs.mul_(valid[:, None])                                # softmax - target
            if grad_bias is not None:
                grad_bias += probs.sum(dim=0)
            if onednn:
                chunk_grad_hidden, chunk_grad_weight = linear_grads(probs, h, weight)   # [n, H], [V, H]
                grad_hidden[start:stop] = chunk_grad_hidden
                grad_weight += chunk_grad_weight
            else:
                torch.mm(probs, weight, out=grad_hidden[start:stop])       # [n, H]
                grad_weight.addmm_(probs.t(), h)                          # [V, H]
    return total, total_nll, (grad_hidden, grad_weight, grad_bias)


def _low_pass(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, ignore_index: int,
              block_rows: int, with_grad: bool, smoothing: float,
              dtype: torch.dtype) -> tuple[Tensor, Tensor, Grads]:
    """Summed smoothed loss and NLL (and unit gradients of the loss) with GEMM operands and
    probabilities in ``dtype``.

    The bias is folded into the GEMMs: ``[h | 1] @ [W | b].T`` are the logits and
    ``(softmax - target).T @ [h | 1]`` is ``[dW | db]``. Loss and gradients come
    back in the weight's dtype; GEMMs accumulate in fp32.
    """
    n, width = hidden.shape
    vocab = weight.shape[0]
    extra = 1 if bias is not None else 0
    w_low = weight.new_empty((vocab, width + extra), dtype=dtype)               # [V, H(+1)]
    w_low[:, :width].copy_(weight)
    h_low = hidden.new_empty((n, width + extra), dtype=dtype)                  # [N, H(+1)]
    h_low[:, :width].copy_(hidden)
    if bias is not None:
        w_low[:, width].copy_(bias)
        h_low[:, width].fill_(1.0)
    nll = hidden.new_zeros(n)                                              # [N] fp32
    loss = hidden.new_zeros(n) if smoothing else nll                       # [N] fp32
    grad_hidden = torch.empty_like(hidden) if with_grad else None
    grad_low = None              # [V, H(+1)]: one block's low product, or fp32 sum of several
    for start in range(0, n, block_rows):
        stop = min(start + block_rows, n)
        h = h_low[start:stop]                                              # [n, H(+1)]
        tgt = targets[start:stop]                                          # [n]
        probs = torch.mm(h, w_low.t())                                     # [n, V] logits, low precision
        valid = tgt != ignore_index if ignore_index >= 0 else None
        at_target = (torch.arange(stop - start, device=tgt.device),
                     tgt.clamp(min=0) if valid is not None else tgt)       # index, not scatter:
        if smoothing:
            target_logit = probs[at_target].float()                        # [n]
            mean_logit = probs.sum(dim=1, dtype=torch.float32).div_(vocab)  # [n]
        torch.ops.aten._softmax.out(probs, 1, False, out=probs)            # in place: one exp pass
        target_prob = probs[at_target].float().clamp_(min=torch.finfo(torch.float32).tiny)
        block_nll = -target_prob.log_()                                    # [n]
        nll[start:stop] = block_nll if valid is None else block_nll * valid
        if smoothing:            # logsumexp = nll + target logit
            block_loss = (1 - smoothing) * block_nll + smoothing * (block_nll + target_logit - mean_logit)
            loss[start:stop] = block_loss if valid is None else block_loss * valid
        if not with_grad:
            continue
        # softmax - target (index_put_: scatter_add_ on bf16 copies the whole block twice)
        if smoothing:
            probs.sub_(smoothing / vocab)
        probs.index_put_(at_target, probs.new_full((), smoothing - 1.0), accumulate=True)
        if valid is not None:
            probs.mul_(valid[:, None])
        grad_hidden[start:stop] = torch.mm(probs, w_low)[:, :width]       # [n, H]
        block_grad = torch.mm(probs.t(), h)                               # [V, H(+1)] low
        grad_low = block_grad if grad_low is None else grad_low.float().add_(block_grad)
    if not with_grad:
        return loss.sum(), nll.sum(), (None, None, None)
    # one strided copy each into dense gradients of the parameters' dtype
    grad_weight = torch.empty_like(weight).copy_(grad_low[:, :width])
    grad_bias = torch.empty_like(bias).copy_(grad_low[:, width]) if bias is not None else None
    return loss.sum(), nll.sum(), (grad_hidden, grad_weight, grad_bias)


class _LinearCrossEntropy(torch.autograd.Function):
    """(Summed smoothed loss, summed NLL); saves the (unit) gradients of the loss computed in forward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                ignore_index: int, chunk_rows: int | None, with_grad: bool,
                gemm_dtype: torch.dtype | None, smoothing: float, linear_gemm: str) -> tuple[Tensor, Tensor]:
        if gemm_dtype is not None and gemm_dtype != weight.dtype:
            rows = chunk_rows or max(1, DEFAULT_LOW_BLOCK_BYTES // (weight.shape[0] * gemm_dtype.itemsize))
            total, nll, grads = _low_pass(hidden, weight, bias, targets, ignore_index, rows, with_grad,
                                          smoothing, gemm_dtype)
        else:
            onednn = linear_gemm == "onednn" and onednn_serves(hidden, weight)
            rows = chunk_rows or (ONEDNN_CHUNK_ROWS if onednn else DEFAULT_CHUNK_ROWS)
            total, nll, grads = _fp32_pass(hidden, weight, bias, targets, ignore_index, rows, with_grad,
                                           smoothing, onednn)
        if with_grad:
            ctx.save_for_backward(*grads)
        ctx.has_bias = bias is not None
        ctx.mark_non_differentiable(nll)
        return total, nll

    @staticmethod
    def backward(ctx, grad_total: Tensor, grad_nll: Tensor | None = None):  # type: ignore[override]
        # Scaled in place: a fresh [V, H] result would cost an allocation and its page faults
        # every step. A second backward through the same graph (retain_graph) is refused by
        # autograd's version check on the saved tensors, never answered with twice-scaled values.
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_total
        gb = grad_bias.mul_(scale) if ctx.has_bias else None
        return grad_hidden.mul_(scale), grad_weight.mul_(scale), gb, None, None, None, None, None, None, None


def linear_token_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                      label_smoothing: float = 0.0, ignore_index: int = -1, chunk_rows: int | None = None,
                      gemm_dtype: torch.dtype | None = None, linear_gemm: str = "aten") -> tuple[Tensor, Tensor]:
    """(Summed label-smoothed cross-entropy, summed NLL) of ``hidden @ weight.T + bias``.

    The first is differentiable and equals ``F.cross_entropy(logits, targets,
    label_smoothing=label_smoothing, reduction="sum")`` (ignored rows count zero); the
    second is the plain NLL sum from the same pass (no gradient). Arguments as
    :func:`linear_cross_entropy`.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: hidden must be [N, H] and targets [N], "
                         f"got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    with_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        hidden = hidden.to(weight.dtype)
        return _LinearCrossEntropy.apply(hidden.contiguous(), weight, bias, targets.contiguous(),
                                         ignore_index, chunk_rows, with_grad, gemm_dtype,
                                         float(label_smoothing), linear_gemm)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                         ignore_index: int = -1, chunk_rows: int | None = None,
                         gemm_dtype: torch.dtype | None = None, linear_gemm: str = "aten") -> Tensor:
    """Summed cross-entropy of ``hidden @ weight.T + bias`` against ``targets``.

    hidden [N, H]; weight [V, H]; bias [V] or None; targets [N]. Rows whose
    target equals ``ignore_index`` (when >= 0) count zero. Returns a scalar.
    Runs in the weight's dtype (autocast is disabled inside; bf16 hidden is cast up).
    ``chunk_rows`` bounds the rows of logits live at once (None: 256 in fp32, 1024 in fp32 with
    ``linear_gemm="onednn"``, a 64 MiB block with bf16 operands).
    ``gemm_dtype=torch.bfloat16`` runs the GEMMs on bf16 operands and keeps the
    softmax probabilities in bf16 (fp32 accumulation everywhere; loss and
    gradients returned in fp32): about 2x faster on CPUs with AVX512-BF16, with
    bf16 rounding of logits, probabilities and gradients. ``linear_gemm="onednn"``
    takes the fp32 GEMMs from oneDNN on a CPU (:mod:`hotloop.ops.linear_gemm`).
    """
    return linear_token_loss(hidden, weight, bias, targets, ignore_index=ignore_index,
                             chunk_rows=chunk_rows, gemm_dtype=gemm_dtype, linear_gemm=linear_gemm)[0]
