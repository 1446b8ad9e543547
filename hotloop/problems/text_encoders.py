"""Subword text encoders (SentencePiece BPE) with hotloop's reserved ids.

Ids 0 (``<pad>``) and 1 (``</s>``, EOS) are reserved as everywhere in hotloop
(:data:`hotloop.problems.base.PAD_ID` / ``EOS_ID``); 2 is ``<unk>``.
SentencePiece is an optional dependency (``pip install hotloop[text]``).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..data.errors import DataError
from .base import EOS_ID, PAD_ID

__all__ = ["SubwordEncoder", "require_sentencepiece"]


def require_sentencepiece() -> Any:
    try:
        import sentencepiece
    except ImportError:
        raise DataError("this problem needs SentencePiece for its subword vocabulary: "
                        "pip install 'hotloop[text]' (or pip install sentencepiece)") from None
    return sentencepiece


class SubwordEncoder:
    """A trained SentencePiece model: ``encode(text) -> ids + [EOS]``, ``decode(ids) -> text``."""

    def __init__(self, model_proto: bytes) -> None:
        spm = require_sentencepiece()
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if self._sp.pad_id() != PAD_ID or self._sp.eos_id() != EOS_ID:
            raise DataError("subword model does not reserve id 0 for padding and 1 for EOS")

    @classmethod
    def train(cls, sentences: Iterable[str], vocab_size: int, *, model_type: str = "bpe") -> "SubwordEncoder":
        """Train deterministically (one thread, input order kept, every sentence used)."""
        spm = require_sentencepiece()
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=2, bos_id=-1,
            character_coverage=1.0, num_threads=1, input_sentence_size=0,
            shuffle_input_sentence=False, minloglevel=2)
        return cls(model.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "SubwordEncoder":
        try:
            return cls(Path(path).read_bytes())
        except OSError as exc:
            raise DataError(f"{path}: cannot read the subword model ({exc}); re-run datagen") from exc
        except RuntimeError as exc:  # sentencepiece's parse error
            raise DataError(f"{path}: not a SentencePiece model ({exc}); re-run datagen") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.model_proto)

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text)) + [EOS_ID]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [ids + [EOS_ID] for ids in self._sp.encode(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        out: list[int] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i != PAD_ID:
                out.append(i)
        return self._sp.decode(out)
