"""Seq2seq models as two runtime graphs: an encoder and a one-step decoder with cache inputs/outputs.

For an encoder-decoder with incremental decoding (``encode_for_decoding``,
``empty_cache``, ``cached_step``; see :mod:`hotloop.models.encoder_decoder`):

- ``encoder``: ``inputs [B, S]`` -> ``memory [B, S, H]``, ``src_pad [B, S]`` (bool),
  ``source0, source1, ...`` (the model's source cache, e.g. the Transformer's
  per-layer cross-attention keys/values ``[B, heads, S, d]``)
- ``decoder_step``: ``tokens [N]``, ``step []`` (int64, tokens fed so far),
  ``memory``, ``src_pad``, ``source*``, ``cache0, cache1, ...`` (e.g. per-layer
  self-attention keys/values ``[N, heads, past, d]``, ``past = step``) ->
  ``logits [N, V]``, ``cache0_out, ...`` (``past + 1``)

:class:`RuntimeDecoder` runs these graphs behind the same
``start_decoding``/``decode_step`` interface as the PyTorch model, so
:func:`hotloop.decode.search.greedy_search` and ``beam_search`` run on ONNX
Runtime or OpenVINO unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..models.encoder_decoder import START_ID, DecodeState, EncoderDecoder
from ..ops.cpu_isa import cpu_isa
from ..problems.base import NUM_RESERVED, PAD_ID
from .errors import ExportError
from .graphs import GraphSignature
from .runtimes import Runner

__all__ = ["openvino_decoding_unavailable", "supports_incremental", "seq2seq_graphs", "cache_init", "Seq2SeqGraph", "RuntimeDecoder",
           "RuntimeDecodeState", "load_decoder"]


def supports_incremental(model: nn.Module) -> bool:
    """Whether ``model`` implements cached one-step decoding."""
    return isinstance(model, EncoderDecoder) and type(model).cached_step is not EncoderDecoder.cached_step


class _EncoderGraph(nn.Module):
    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor) -> tuple[Tensor, ...]:
        memory, src_pad, source = self.model.encode_for_decoding(inputs)   # [B, S, H], [B, S], ...
        return (memory, src_pad, *source)


class _DecoderStepGraph(nn.Module):
    def __init__(self, model: EncoderDecoder, num_source: int) -> None:
        super().__init__()
        self.model, self.num_source = model, num_source

    def forward(self, tokens: Tensor, step: Tensor, memory: Tensor, src_pad: Tensor,
                *caches: Tensor) -> tuple[Tensor, ...]:
        source, cache = caches[: self.num_source], caches[self.num_source:]
        # steps is a 0-d tensor here, so the position lookup stays in the graph
        state = DecodeState(memory, src_pad, steps=step, cache=tuple(cache),  # type: ignore[arg-type]
                            source_cache=tuple(source))
        hidden, new_cache = self.model.cached_step(tokens, state)          # [N, H]
        return (self.model.top(hidden), *new_cache)                         # [N, V], ...


@dataclass
class Seq2SeqGraph:
    """One graph to export: its module, signature, example inputs and check inputs."""

    module: nn.Module
    signature: GraphSignature
    example: tuple[Tensor, ...]
    checks: list[tuple[Tensor, ...]]


def _tokens(model: EncoderDecoder, batch: int, length: int, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    vocab = model.spec.input_vocab_size
    ids = torch.randint(NUM_RESERVED, max(vocab, NUM_RESERVED + 1), (batch, length), generator=gen)  # [B, S]
    if length > 2 and batch > 1:
        ids[0, -2:] = PAD_ID                         # one padded source per batch
    return ids


def _run_steps(model: EncoderDecoder, inputs: Tensor, steps: int, seed: int) -> tuple[Tensor, ...]:
    """Decoder-step graph inputs after ``steps`` real (eager) steps on random tokens."""
    with torch.no_grad():
        memory, src_pad, source = model.encode_for_decoding(inputs)
        state = DecodeState(memory, src_pad, source_cache=source)
        cache = model.empty_cache(state)
        gen = torch.Generator().manual_seed(seed)
        tokens = inputs.new_full((inputs.shape[0],), START_ID)
        for i in range(steps):
            _, cache = model.cached_step(tokens, replace(state, steps=i, cache=cache))
            tokens = torch.randint(NUM_RESERVED, model.spec.target_vocab_size, tokens.shape, generator=gen)
    return (tokens, torch.tensor(steps, dtype=torch.long), memory, src_pad, *source, *cache)


def _axes(a: Tensor, b: Tensor, name: str) -> dict[int, str]:
    return {i: name for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y}


def seq2seq_graphs(model: EncoderDecoder) -> dict[str, Seq2SeqGraph]:
    """The ``encoder`` and ``decoder_step`` graphs of ``model`` (eval mode), with dynamic axes found by probing."""
    model = model.eval()
    with torch.no_grad():
        short = model.encode_for_decoding(_tokens(model, 1, 3, 0))
        longer = model.encode_for_decoding(_tokens(model, 1, 4, 0))
    num_source = len(short[2])
    enc_out = ["memory", "src_pad", *(f"source{i}" for i in range(num_source))]
    enc_axes: dict[str, dict[int, str]] = {"inputs": {0: "batch", 1: "src_len"}}
    for name, a, b in zip(enc_out, (short[0], short[1], *short[2]), (longer[0], longer[1], *longer[2])):
        enc_axes[name] = {0: "batch", **_axes(a, b, "src_len")}
    encoder = Seq2SeqGraph(_EncoderGraph(model).eval(), GraphSignature("encoder", ["inputs"], enc_out, enc_axes),
                           (_tokens(model, 2, 5, 1),), [(_tokens(model, 1, 7, 2),), (_tokens(model, 3, 4, 3),)])

    zero, one = _run_steps(model, _tokens(model, 1, 3, 0), 0, 0), _run_steps(model, _tokens(model, 1, 3, 0), 1, 0)
    num_cache = len(zero) - 4 - num_source
    caches = [f"cache{i}" for i in range(num_cache)]
    dec_axes: dict[str, dict[int, str]] = {"tokens": {0: "batch"}, "logits": {0: "batch"}}
    dec_axes.update({name: axes for name, axes in enc_axes.items() if name != "inputs"})
    for i, name in enumerate(caches):
        past = _axes(zero[4 + num_source + i], one[4 + num_source + i], "past")
        dec_axes[name] = {0: "batch", **past}
        dec_axes[f"{name}_out"] = {0: "batch", **{axis: "past_out" for axis in past}}
    dec_sig = GraphSignature("decoder_step", ["tokens", "step", *enc_out, *caches],
                             ["logits", *(f"{c}_out" for c in caches)], dec_axes)
    decoder = Seq2SeqGraph(_DecoderStepGraph(model, num_source).eval(), dec_sig,
                           _run_steps(model, _tokens(model, 2, 5, 1), 3, 4),
                           [_run_steps(model, _tokens(model, 1, 7, 2), 0, 5),
                            _run_steps(model, _tokens(model, 3, 4, 3), 2, 6)])
    return {"encoder": encoder, "decoder_step": decoder}


def cache_init(model: EncoderDecoder) -> list[dict[str, Any]]:
    """How each cache tensor starts, for the manifest: ``{"from": "source", "index": i}`` (a source-cache
    tensor, e.g. the LSTM encoder's final state) or ``{"from": "zeros", "shape": [...]}`` (-1 = batch)."""
    with torch.no_grad():
        memory, src_pad, source = model.encode_for_decoding(_tokens(model, 2, 3, 0))
        empty = model.empty_cache(DecodeState(memory, src_pad, source_cache=source))
    out: list[dict[str, Any]] = []
    for tensor in empty:
        match = next((i for i, s in enumerate(source) if s.shape == tensor.shape and torch.equal(s, tensor)), None)
        if match is not None:
            out.append({"from": "source", "index": match})
        elif not tensor.numel() or not tensor.any():
            out.append({"from": "zeros", "shape": [-1, *tensor.shape[1:]]})
        else:
            raise ExportError(f"{type(model).__name__}: its initial decoder cache is neither zeros nor part of its "
                              f"source cache, so a runtime cannot build it")
    return out


# ----------------------------------------------------------------------------- runtime decoding
@dataclass
class RuntimeDecodeState:
    """The runtime counterpart of :class:`DecodeState` (torch tensors on the CPU)."""

    encoded: tuple[Tensor, ...]       # memory, src_pad, source cache (never reordered)
    cache: tuple[Tensor, ...]
    steps: int = 0

    def reorder(self, index: Tensor) -> "RuntimeDecodeState":
        return replace(self, cache=tuple(t.index_select(0, index) for t in self.cache))


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


class RuntimeDecoder:
    """``start_decoding``/``decode_step`` over exported ``encoder`` and ``decoder_step`` graphs.

    ``init`` says how each cache tensor starts (:func:`cache_init`). ``cached`` is accepted for
    interface compatibility: a runtime always decodes from its cache.
    """

    def __init__(self, encoder: Runner, decoder: Runner, init: list[dict[str, Any]],
                 max_decode_length: int | None = None) -> None:
        self.encoder, self.decoder, self.init = encoder, decoder, init
        self.max_decode_length = max_decode_length

    def start_decoding(self, inputs: Tensor, *, beam_size: int = 1, cached: bool = True) -> RuntimeDecodeState:
        encoded = tuple(torch.from_numpy(np.asarray(a)) for a in self.encoder([_numpy(inputs)]))
        if beam_size > 1:
            encoded = tuple(t.repeat_interleave(beam_size, dim=0) for t in encoded)
        rows, source = encoded[0].shape[0], encoded[2:]
        cache = tuple(source[entry["index"]] if entry["from"] == "source"
                      else torch.zeros([rows if d == -1 else d for d in entry["shape"]]) for entry in self.init)
        return RuntimeDecodeState(encoded, cache)

    def decode_step(self, tokens: Tensor, state: RuntimeDecodeState) -> tuple[Tensor, RuntimeDecodeState]:
        """tokens [N] -> (logits [N, V], next state)."""
        feeds = [_numpy(tokens), np.asarray(state.steps, dtype=np.int64),
                 *(_numpy(t) for t in state.encoded), *(_numpy(t) for t in state.cache)]
        outputs = [torch.from_numpy(np.asarray(a)) for a in self.decoder(feeds)]
        return outputs[0], replace(state, cache=tuple(outputs[1:]), steps=state.steps + 1)


def openvino_decoding_unavailable(runtime: str) -> str | None:
    """Why cached decoding on ``runtime`` is refused on this CPU (None: it is not).

    OpenVINO 2026.4's CPU kernels without AVX-512 (a Zen 3 CPU, or ``ONEDNN_MAX_CPU_ISA=AVX2``)
    return decoder-step logits that leave torch's once the cache holds 8 steps: measured on a
    tiny transformer, within 5e-7 for steps 1-7, then 0.3 to 1.2 (ONNX Runtime stays within
    5e-7 throughout), so greedy and beam outputs are wrong there.
    """
    if runtime != "openvino" or "avx512" in cpu_isa().usable:
        return None
    return ("OpenVINO's cached decoding gives wrong logits from step 8 on CPUs without AVX-512 "
            f"(usable ISA {cpu_isa().describe()}); decode with --runtime onnxruntime")


def load_decoder(export_dir: str | Path, runtime: str = "onnxruntime", *, precision: str = "fp32",
                 threads: int = 0) -> RuntimeDecoder:
    """A :class:`RuntimeDecoder` over the ``encoder`` and ``decoder_step`` graphs of an ONNX/OpenVINO export."""
    from .artifacts import read_manifest
    from .runtimes import load_runtime
    manifest = read_manifest(export_dir)
    decoding = manifest.get("decoding")
    if not decoding:
        raise ExportError(f"{export_dir} has no encoder/decoder_step graphs: export a seq2seq model with "
                          f"incremental decoding as onnx or openvino")
    refusal = openvino_decoding_unavailable(runtime)
    if refusal:
        raise ExportError(refusal)
    encoder = load_runtime(export_dir, runtime, graph="encoder", precision=precision, threads=threads)
    decoder = load_runtime(export_dir, runtime, graph="decoder_step", precision=precision, threads=threads)
    return RuntimeDecoder(encoder, decoder, decoding["cache_init"], decoding.get("max_decode_length"))
