"""Streamed decoding of text lines: seq2seq translation or LM sampling, in length-sorted batches.

:func:`decode_stream` reads ``(index, text)`` lines, collects a chunk of
``batch_size * CHUNK_BATCHES`` lines, decodes it batch by batch and hands every
finished line to an :class:`~hotloop.decode.text_io.OrderedWriter`. A bad input
line stops the stream after everything read before it was decoded and written.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Iterator

import torch

from .sampling import sample_lm
from .text_io import DecodeInputError, OrderedWriter, TextCodec
from .translate import DecodeOptions, decode_batch, fit_source, length_sorted, pad_batch

__all__ = ["Seq2SeqWorker", "LMWorker", "decode_stream", "CHUNK_BATCHES"]

CHUNK_BATCHES = 4   # batches of lines read ahead and sorted together
Done = list[tuple[int, str]]


def _warn(message: str) -> None:
    print(f"hotloop: warning: {message}", file=sys.stderr)


class Seq2SeqWorker:
    """Translate lines; an empty line is answered with an empty line, a long source is cut."""

    def __init__(self, model: Any, codec: TextCodec, max_input_length: int, *, device: str | torch.device,
                 beam_size: int = 4, alpha: float = 0.6, max_extra: int = 50) -> None:
        self.model, self.codec, self.device = model, codec, device
        self.max_input_length = max_input_length
        self.options = DecodeOptions(beam_size=beam_size, alpha=alpha, max_extra=max_extra)

    def prepare(self, index: int, text: str, source: str) -> list[int] | None:
        if not text.strip():
            return None
        ids = self.codec.encode(text) + [self.codec.boundary_id]
        fitted, cut = fit_source(ids, self.max_input_length)
        if cut:
            _warn(f"{source} line {index + 1}: {len(ids)} tokens, longer than the model's maximum input "
                  f"length {self.max_input_length}; decoded its first {self.max_input_length} tokens")
        return fitted

    def decode(self, items: list[tuple[int, list[int]]], batch_size: int) -> Iterator[Done]:
        for batch in length_sorted(items, batch_size):
            outputs = decode_batch(self.model, [ids for _, ids in batch], self.options, self.device)
            yield [(index, self.codec.decode(out)) for (index, _), out in zip(batch, outputs)]


class LMWorker:
    """Continue prompts by sampling; prompts of one batch have the same length (no padding)."""

    def __init__(self, model: Any, codec: TextCodec, *, device: str | torch.device, max_new_tokens: int = 50,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> None:
        self.model, self.codec, self.device = model, codec, torch.device(device)
        self.max_new_tokens = max(1, max_new_tokens)
        self.sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def prepare(self, index: int, text: str, source: str) -> list[int] | None:
        return [self.codec.boundary_id] + self.codec.encode(text)   # the prompt starts a sentence

    def decode(self, items: list[tuple[int, list[int]]], batch_size: int) -> Iterator[Done]:
        groups: dict[int, list[tuple[int, list[int]]]] = {}
        for item in items:
            groups.setdefault(len(item[1]), []).append(item)
        for group in groups.values():
            for start in range(0, len(group), batch_size):
                batch = group[start: start + batch_size]
                prompts = pad_batch([ids for _, ids in batch], self.device)   # [B, P], equal lengths
                with torch.no_grad():
                    samples = sample_lm(self.model, prompts, max_new_tokens=self.max_new_tokens,
                                        stop_id=self.codec.boundary_id, generator=self.generator,
                                        **self.sampling)
                yield [(index, self.codec.decode([t for t in ids if t != self.codec.boundary_id]))
                       for (index, _), ids in zip(batch, samples)]


def decode_stream(worker: Any, lines: Iterable[tuple[int, str]], writer: OrderedWriter, *, batch_size: int,
                  source: str, on_done: Callable[[int], Any] | None = None) -> int:
    """Decode every line into ``writer``; returns the number of lines written."""
    chunk: list[tuple[int, list[int]]] = []
    report = on_done or (lambda n: None)

    def process() -> None:
        for done in worker.decode(chunk, batch_size):
            writer.put_many(done)
            report(len(done))
        chunk.clear()

    try:
        for index, text in lines:
            ids = worker.prepare(index, text, source)
            if ids is None:
                writer.put(index, "")
                report(1)
                continue
            chunk.append((index, ids))
            if len(chunk) >= batch_size * CHUNK_BATCHES:
                process()
    except DecodeInputError:
        process()
        raise
    process()
    return writer.written
