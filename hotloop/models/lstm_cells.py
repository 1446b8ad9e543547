"""Interchangeable formulations of one multi-layer LSTM (same math, same parameters).

Every formulation reads the parameters of one ``nn.LSTM`` (gate order i, f, g, o;
``weight_ih_l{k}`` [4H, I], ``weight_hh_l{k}`` [4H, H], ``bias_ih_l{k}``,
``bias_hh_l{k}`` [4H]) so checkpoints interchange between them:

- ``fused``: ``nn.LSTM`` itself (cuDNN on GPU, oneDNN/ATen on CPU).
- ``unrolled``: a per-step cell from primitive ops, both input and recurrent
  projections per step (the "static graph" formulation).
- ``hoisted``: one GEMM for the input projections of all steps per layer,
  only the recurrent GEMM inside the time loop.
- ``bptt``: ``hoisted`` with a hand-written backward (one reverse loop, then
  three GEMMs over all steps; see :mod:`.lstm_bptt`). The only formulation that
  takes ``gemm_dtype`` (bf16 GEMM operands, fp32 gates and state).

All functions map ``x [T, B, I]`` and ``(h0, c0)`` each ``[L, B, H]`` to
``(y [T, B, H], (hT, cT))``; dropout (if any) is applied between layers only,
never on the recurrent connection. ``dropout_masks`` picks how its masks are
drawn (:mod:`hotloop.ops.dropout`); with ``bits16`` the ``fused`` formulation
runs ``nn.LSTM``'s kernel one layer at a time so the masks between layers are
its own.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops.cpu_isa import cpu_isa
from ..ops.dropout import dropout as apply_dropout
from .lstm_bptt import lstm_layer_bptt

__all__ = ["LSTM_IMPLS", "LSTMState", "run_lstm", "LSTMImplError", "bf16_lstm_unavailable", "nn_lstm"]

LSTMState = tuple[Tensor, Tensor]


class LSTMImplError(ValueError):
    """Unknown LSTM formulation name."""


def _layer_params(rnn: nn.LSTM, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (getattr(rnn, f"weight_ih_l{layer}"), getattr(rnn, f"weight_hh_l{layer}"),
            getattr(rnn, f"bias_ih_l{layer}"), getattr(rnn, f"bias_hh_l{layer}"))


def _cell_update(gates: Tensor, c: Tensor) -> LSTMState:
    """gates [B, 4H] pre-activations (i, f, g, o), c [B, H] -> (h, c) [B, H]."""
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def _fused_layer(rnn: nn.LSTM, layer: int, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Layer ``layer`` of ``rnn`` through the same kernel ``nn.LSTM`` runs (``_VF.lstm``)."""
    y, h_n, c_n = torch._VF.lstm(x, (h[None], c[None]), list(_layer_params(rnn, layer)),  # type: ignore[attr-defined]
                                 True, 1, 0.0, rnn.training, False, False)
    return y, h_n[0], c_n[0]


def bf16_lstm_unavailable(x: Tensor) -> str | None:
    """Why ``nn.LSTM`` on ``x`` cannot run under the active bf16 autocast (None: it can).

    oneDNN has a bf16 LSTM primitive only on CPUs with AVX512-BF16 or AMX (usable, see
    :func:`hotloop.ops.cpu_isa.cpu_isa`); elsewhere nn.LSTM raises under CPU bf16 autocast.
    """
    if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return None
    if torch.get_autocast_dtype("cpu") != torch.bfloat16 or cpu_isa().fast_bf16:
        return None
    return f"oneDNN has no bf16 LSTM on this CPU (usable ISA: {cpu_isa().describe()})"


def nn_lstm(rnn: nn.LSTM, x: Tensor, state: LSTMState | None = None) -> tuple[Tensor, LSTMState]:
    """``rnn(x, state)``; in fp32 (the rest of the model stays bf16) where bf16 autocast is on
    but oneDNN has no bf16 LSTM (:func:`bf16_lstm_unavailable`)."""
    if bf16_lstm_unavailable(x) is None:
        return rnn(x, state)
    with torch.autocast("cpu", enabled=False):
        return rnn(x.float(), None if state is None else (state[0].float(), state[1].float()))


def _fused(rnn: nn.LSTM, x: Tensor, state: LSTMState, dropout: float, training: bool,
           gemm_dtype: torch.dtype | None = None, masks: str = "bernoulli") -> tuple[Tensor, LSTMState]:
    if bf16_lstm_unavailable(x) is not None:     # nn.LSTM in fp32; the rest of the model stays bf16
        with torch.autocast("cpu", enabled=False):
            return _fused(rnn, x.float(), (state[0].float(), state[1].float()), dropout, training,
                          gemm_dtype, masks)
    if masks != "bernoulli" and dropout > 0 and training and rnn.num_layers > 1:
        return _stack(_fused_layer, rnn, x, state, dropout, training, masks)
    y, (h, c) = rnn(x, state)
    return y, (h, c)


def _stack(layer_fn: Callable[[nn.LSTM, int, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]],
           rnn: nn.LSTM, x: Tensor, state: LSTMState, dropout: float, training: bool,
           masks: str = "bernoulli") -> tuple[Tensor, LSTMState]:
    h0, c0 = state
    hs, cs = [], []
    for layer in range(rnn.num_layers):
        if layer > 0 and dropout > 0:
            x = apply_dropout(x, dropout, training, masks)
        x, h, c = layer_fn(rnn, layer, x, h0[layer], c0[layer])
        hs.append(h)
        cs.append(c)
    return x, (torch.stack(hs), torch.stack(cs))


def _unrolled_layer(rnn: nn.LSTM, layer: int, x: Tensor, h: Tensor, c: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor]:
    w_ih, w_hh, b_ih, b_hh = _layer_params(rnn, layer)
    outputs = []
    for t in range(x.shape[0]):
        gates = F.linear(x[t], w_ih, b_ih) + F.linear(h, w_hh, b_hh)  # [B, 4H]
        h, c = _cell_update(gates, c)
        outputs.append(h)
    return torch.stack(outputs), h, c                                   # [T, B, H]


def _hoisted_layer(rnn: nn.LSTM, layer: int, x: Tensor, h: Tensor, c: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor]:
    w_ih, w_hh, b_ih, b_hh = _layer_params(rnn, layer)
    steps, batch = x.shape[0], x.shape[1]
    gx = torch.addmm(b_ih + b_hh, x.reshape(steps * batch, -1), w_ih.t())  # [T*B, 4H]
    w_hh_t = w_hh.t()
    outputs = []
    for gx_t in gx.split(batch):                                        # one split, T views
        h, c = _cell_update(torch.addmm(gx_t, h, w_hh_t), c)
        outputs.append(h)
    return torch.stack(outputs), h, c                                   # [T, B, H]


def _unrolled(rnn, x, state, dropout, training, gemm_dtype=None, masks="bernoulli"):
    return _stack(_unrolled_layer, rnn, x, state, dropout, training, masks)


def _hoisted(rnn, x, state, dropout, training, gemm_dtype=None, masks="bernoulli"):
    return _stack(_hoisted_layer, rnn, x, state, dropout, training, masks)


def _bptt(rnn, x, state, dropout, training, gemm_dtype=None, masks="bernoulli"):
    def layer_fn(rnn: nn.LSTM, layer: int, x: Tensor, h: Tensor, c: Tensor):
        return lstm_layer_bptt(x, h, c, *_layer_params(rnn, layer), gemm_dtype=gemm_dtype)
    return _stack(layer_fn, rnn, x, state, dropout, training, masks)


LSTM_IMPLS: dict[str, Callable[..., tuple[Tensor, LSTMState]]] = {
    "fused": _fused, "unrolled": _unrolled, "hoisted": _hoisted, "bptt": _bptt,
}


def run_lstm(impl: str, rnn: nn.LSTM, x: Tensor, state: LSTMState, *, dropout: float = 0.0,
             training: bool = False, gemm_dtype: torch.dtype | None = None,
             dropout_masks: str = "bernoulli") -> tuple[Tensor, LSTMState]:
    """Run the stacked LSTM ``rnn`` on ``x [T, B, I]`` with formulation ``impl``.

    ``gemm_dtype`` (bf16 GEMM operands) is honoured by ``bptt`` only; the other
    formulations ignore it (``LSTMLM`` rejects the combination). ``dropout_masks``
    ("bernoulli" | "bits16") draws the masks between layers.
    """
    try:
        fn = LSTM_IMPLS[impl]
    except KeyError:
        raise LSTMImplError(f"unknown lstm_impl {impl!r}; choose one of {sorted(LSTM_IMPLS)}") from None
    return fn(rnn, x, state, dropout, training, gemm_dtype, dropout_masks)
