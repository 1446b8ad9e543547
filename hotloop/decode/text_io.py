"""Text in and out of ``hotloop decode``: a problem's text codec, checked input lines, ordered output.

Input lines are read as bytes and decoded as strict UTF-8, so a bad line is
reported by number; results are written in input order as soon as every
earlier line is written (:class:`OrderedWriter`), so an error stops the run
without losing what was already decoded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator

from ..data.shards import manifest_matches
from ..errors import UserError
from ..problems.base import EOS_ID, Problem
from ..problems.prepared import PreparedProblem

__all__ = ["DecodeInputError", "TextCodec", "text_codec", "read_lines", "OrderedWriter"]


class DecodeInputError(UserError):
    """An input line or a run that ``hotloop decode`` cannot use."""


@dataclass
class TextCodec:
    """``encode`` gives ids without the end token; ``boundary_id`` ends (and, for an LM, starts) a sentence."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    boundary_id: int


def _require_prepared(problem: Problem) -> None:
    if isinstance(problem, PreparedProblem) and problem.data_dir is not None:
        if not manifest_matches(problem.data_dir, problem.name, problem.config):
            raise DecodeInputError(
                f"{problem.data_dir}: no prepared vocabulary for problem {problem.name}; run "
                f"`hotloop datagen --problem {problem.name} --data-dir {problem.data_dir}` or pass --data-dir")


def text_codec(problem: Any) -> TextCodec:
    """The problem's text encoder: a subword ``encoder`` (ids end in EOS), or ``encode`` + ``vocab``
    with an ``<eos>`` word (word-level LMs). Raises :class:`DecodeInputError` when it has neither
    or its vocabulary was never prepared."""
    _require_prepared(problem)
    if hasattr(problem, "encoder"):
        encoder = problem.encoder
        return TextCodec(lambda text: encoder.encode(text)[:-1], encoder.decode, EOS_ID)
    if hasattr(problem, "encode") and hasattr(problem, "vocab"):
        vocab = problem.vocab
        if "<eos>" not in vocab:
            raise DecodeInputError(f"problem {problem.name}: its vocabulary has no <eos> word")
        return TextCodec(problem.encode, problem.decode, vocab.index("<eos>"))
    raise DecodeInputError(f"problem {problem.name} has no text encoder, so it cannot decode text")


def read_lines(handle: IO[bytes], source: str) -> Iterator[tuple[int, str]]:
    """(0-based index, text) per line, the line break removed; a line that is not UTF-8 raises
    :class:`DecodeInputError` naming ``source`` and its line number."""
    for index, raw in enumerate(handle):
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeInputError(f"{source} line {index + 1}: not UTF-8 (byte 0x{raw[exc.start]:02x} at "
                                   f"offset {exc.start}); lines before it were decoded") from None
        yield index, text


class OrderedWriter:
    """Write results by input index, each as soon as all earlier ones are written (flushed)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.written = 0
        self._pending: dict[int, str] = {}

    def put(self, index: int, text: str) -> None:
        self._pending[index] = text
        while self.written in self._pending:
            self.out.write(self._pending.pop(self.written).replace("\n", " ") + "\n")
            self.written += 1
        self.out.flush()

    def put_many(self, items: Iterable[tuple[int, str]]) -> None:
        for index, text in items:
            self.put(index, text)
