"""One LSTM layer with hand-written backpropagation through time (the ``bptt`` formulation).

Same math and parameters as an ``nn.LSTM`` layer (gate order i, f, g, o), laid
out the way cuDNN does it: the input projections of all time steps are one
GEMM, only the recurrent ``[B, H] x [H, 4H]`` GEMM and the gate arithmetic
run per step, and backward is one reverse loop followed by three big GEMMs
(``dx``, ``dW_ih``, ``dW_hh``) over all steps at once. No autograd graph is
built per step, so per-step cost is the GEMM plus ~20 elementwise kernels.

``gemm_dtype=torch.bfloat16`` feeds the GEMMs bf16 operands (fp32
accumulation); gates, cell state, outputs and all gradients stay fp32. On
CPUs with AVX512-BF16 this halves the weight traffic of the per-step GEMMs,
which are memory-bound for large hidden sizes. The bf16 copies of the weights
are made once per step in forward and reused by backward.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["lstm_layer_bptt"]


def _low(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def _mm(a: Tensor, b: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``a @ b`` on ``dtype`` operands (when given), returned in fp32."""
    return torch.mm(_low(a, dtype), _low(b, dtype)).float()


class _LSTMLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor,
                b_ih: Tensor, b_hh: Tensor, gemm_dtype: torch.dtype | None):
        # x [T, B, I]; h0, c0 [B, H]; w_ih [4H, I]; w_hh [4H, H]; biases [4H]
        steps, batch, _ = x.shape
        hidden = h0.shape[1]
        w_ih_low, w_hh_low = _low(w_ih, gemm_dtype), _low(w_hh, gemm_dtype)      # cast once per step
        w_hh_t = w_hh_low.t()                                                   # [H, 4H]
        gates = _mm(x.reshape(steps * batch, -1), w_ih_low.t(), gemm_dtype)     # [T*B, 4H]
        gates = gates.add_(b_ih).add_(b_hh).view(steps, batch, 4 * hidden)    # pre-activations
        cells = x.new_empty(steps, batch, hidden)                               # c_t
        tanh_cells = x.new_empty(steps, batch, hidden)                          # tanh(c_t)
        out = x.new_empty(steps, batch, hidden)                                 # h_t
        h, c = h0, c0
        for t in range(steps):
            g_t = gates[t]                                                      # [B, 4H]
            if gemm_dtype is None:
                g_t.addmm_(h, w_hh_t)
            else:
                g_t.add_(torch.mm(h.to(gemm_dtype), w_hh_t))                    # fp32 += bf16 product
            g_t[:, :2 * hidden].sigmoid_()                                      # i, f
            g_t[:, 2 * hidden:3 * hidden].tanh_()                               # g
            g_t[:, 3 * hidden:].sigmoid_()                                      # o
            i, f, g, o = g_t.chunk(4, dim=1)
            c = torch.addcmul(f * c, i, g, out=cells[t])
            torch.tanh(c, out=tanh_cells[t])
            h = torch.mul(o, tanh_cells[t], out=out[t])
        ctx.save_for_backward(x, h0, c0, w_ih_low, w_hh_low, gates, cells, tanh_cells, out)
        ctx.gemm_dtype = gemm_dtype
        return out, h.clone(), c.clone()

    @staticmethod
    def backward(ctx, d_out: Tensor, d_h_last: Tensor, d_c_last: Tensor):  # type: ignore[override]
        x, h0, c0, w_ih_low, w_hh_low, gates, cells, tanh_cells, out = ctx.saved_tensors
        dtype = ctx.gemm_dtype                                                  # weights: [4H, I], [4H, H]
        steps, batch, _ = x.shape
        hidden = h0.shape[1]
        d_gates = torch.empty_like(gates)                                       # [T, B, 4H]
        d_h_next = d_h_last if d_h_last is not None else h0.new_zeros(h0.shape)   # into h_t from t+1
        d_c = d_c_last.clone() if d_c_last is not None else c0.new_zeros(c0.shape)
        for t in reversed(range(steps)):
            d_h = d_h_next if d_out is None else d_out[t] + d_h_next             # fp32 [B, H]
            i, f, g, o = gates[t].chunk(4, dim=1)
            tc = tanh_cells[t]
            c_prev = cells[t - 1] if t > 0 else c0
            di, df, dg, do = d_gates[t].chunk(4, dim=1)
            torch.mul(d_h, tc, out=do).mul_(o).mul_(1 - o)                    # dL/d(o pre-act)
            d_c.addcmul_(d_h * o, 1 - tc * tc)                                  # through h = o tanh(c)
            torch.mul(d_c, g, out=di).mul_(i).mul_(1 - i)
            torch.mul(d_c, c_prev, out=df).mul_(f).mul_(1 - f)
            torch.mul(d_c, i, out=dg).mul_(1 - g * g)
            d_c.mul_(f)                                                         # to c_{t-1}
            d_h_next = torch.mm(_low(d_gates[t], dtype), w_hh_low)             # to h_{t-1} (gemm dtype)
        flat = d_gates.view(steps * batch, 4 * hidden)                          # [T*B, 4H]
        flat_low = _low(flat, dtype)
        d_x = _mm(flat_low, w_ih_low, dtype).view(x.shape)                      # [T, B, I]
        d_w_ih = _mm(flat_low.t(), x.reshape(steps * batch, -1), dtype)         # [4H, I]
        h_prev = torch.cat([h0[None], out[:-1]]).view(steps * batch, hidden)    # [T*B, H]
        d_w_hh = _mm(flat_low.t(), h_prev, dtype)                               # [4H, H]
        d_b = flat.sum(dim=0)                                                   # [4H]
        return d_x, d_h_next.float(), d_c, d_w_ih, d_w_hh, d_b, d_b.clone(), None


def lstm_layer_bptt(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                    b_hh: Tensor, gemm_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer: ``x [T, B, I]``, ``h0, c0 [B, H]`` -> ``(y [T, B, H], h_T, c_T)``.

    Parameters as in ``nn.LSTM`` layer k. Runs in fp32 (autocast is disabled
    inside); ``gemm_dtype`` sets the GEMM operand dtype (None: fp32).
    """
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, h0, c0 = x.float().contiguous(), h0.float().contiguous(), c0.float().contiguous()
        return _LSTMLayer.apply(x, h0, c0, w_ih, w_hh, b_ih, b_hh, gemm_dtype)
