"""BERT pretraining (masked LM + next-sentence prediction) on Penn Treebank or Multi30k text.

Datagen reads the PTB text files (MD5-verified, see :func:`~hotloop.problems.ptb.fetch_ptb`),
maps PTB's ``<unk>`` to ``[UNK]``, trains a WordPiece vocabulary of
``VOCAB_SIZE`` pieces on the training sentences with the ``tokenizers``
library (deterministically, see :func:`train_wordpiece`) and writes every
split as one ragged array of sentences. Ids are canonical: the special tokens
``[PAD] [SEP] [UNK] [CLS] [MASK]`` take ids 0-4 (``[SEP]`` doubles as
hotloop's EOS id 1) and the other pieces follow in sorted order.

An example is ``[CLS] A [SEP] B [SEP]`` padded to ``max_length`` (default
128): A is one or more consecutive sentences, B the sentences that follow A
(``nsp_targets`` 0, "is next") or, with probability 1/2, sentences from a
random place ("not next", 1). 15% of the pieces (at most ``max_predictions``)
are predicted: 80% become ``[MASK]``, 10% a random piece, 10% stay. Batches:
``inputs``/``segment_ids`` int64 ``[B, T]``, ``mlm_positions``/``targets``
int64 ``[B, P]`` (target 0 = no prediction) and ``nsp_targets`` int64 ``[B]``.
Batch ``i`` of epoch ``e`` depends only on ``(seed, split, e, i)``.

``bert_pretrain_multi30k`` does the same with the lower-cased English
captions of Multi30k; captions do not continue one another, so its pairs are
random and ``nsp_targets`` is ``NSP_IGNORE`` (-100: masked LM only).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable

import numpy as np
import torch

from ..data.download import default_data_dir, default_raw_dir
from ..data.shards import RaggedArray, ShardWriter, open_array, ragged_to_arrays
from ..errors import UserError
from ..hparams import HParams, HParamsError
from ..registry import problems
from .algorithmic import SPLIT_SEEDS, IndexedReader, generated_reader
from .base import Batch, ProblemSpec
from .multi30k import MULTI30K_SHA256, SPLIT_FILES, _read_lines, fetch_multi30k
from .prepared import PreparedProblem
from .ptb import PTB_MD5, SPLITS, fetch_ptb

__all__ = ["BertPretrainHParams", "BertPretrainProblem", "BertPretrainPTB", "BertPretrainMulti30k",
           "SPECIAL_TOKENS", "NSP_IGNORE", "train_wordpiece", "make_pair_example", "require_tokenizers"]

SPECIAL_TOKENS = ("[PAD]", "[SEP]", "[UNK]", "[CLS]", "[MASK]")
PAD, SEP, UNK, CLS, MASK = range(len(SPECIAL_TOKENS))
NSP_IGNORE = -100               # next-sentence target of pairs from unordered sentences
VOCAB_SIZE = 8000
DEFAULT_LENGTH = 128
_WORD_START = "\u2581"


@dataclass(frozen=True)
class BertPretrainHParams(HParams):
    """Problem knobs live with the hparams so ``--hparams`` overrides reach them."""

    mlm_probability: float = 0.15   # share of the pieces that are predicted
    max_predictions: int = 20       # predicted pieces per example (P)
    train_examples: int = 8192      # examples per training "epoch" (about one pass over PTB at T=128)
    eval_examples: int = 1024


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise UserError("bert_pretrain_ptb needs the `tokenizers` library for its WordPiece vocabulary: "
                        "pip install 'hotloop[text]' (or pip install tokenizers)") from None
    return tokenizers


def _wordpiece_pieces(bpe_vocab: Iterable[str]) -> set[str]:
    """BPE pieces with a word-start marker -> WordPiece pieces (``##`` marks a continuation);
    every character gets both forms so any word over the alphabet can be spelled."""
    pieces: set[str] = set()
    for piece in bpe_vocab:
        body = piece[1:] if piece.startswith(_WORD_START) else piece
        if not body:
            continue
        pieces.add(body if piece.startswith(_WORD_START) else "##" + body)
        if len(body) == 1:
            pieces.update((body, "##" + body))
    return pieces


def train_wordpiece(sentences: Iterable[str], vocab_size: int) -> Any:
    """A WordPiece ``tokenizers.Tokenizer`` with exactly ``vocab_size`` canonical ids.

    The library's own ``WordPieceTrainer`` numbers continuation pieces in hash
    order, so equally frequent merges come out differently from run to run.
    Instead its ``BpeTrainer`` learns the pieces on words that carry a word-start
    marker (ids follow the sorted alphabet, so ties break the same way every
    time); marked pieces become word-initial WordPiece pieces, the others ``##``
    continuations, and every character keeps both forms. The pieces are sorted
    after the special tokens and ``[unused<i>]`` fills any remaining ids (as in
    BERT's vocabulary).
    """
    tk = require_tokenizers()
    text = [s.replace("[UNK]", " ") for s in sentences]
    alphabet = set("".join(text)) - set(" \t\n")
    budget = vocab_size - len(SPECIAL_TOKENS)
    target = budget + 1 - len(alphabet)      # each character adds at most its second form
    if target <= len(alphabet) + 1:
        raise UserError(f"vocab_size={vocab_size} is too small for an alphabet of {len(alphabet)} characters")
    bpe = tk.Tokenizer(tk.models.BPE())
    bpe.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement=_WORD_START, prepend_scheme="always")
    bpe.train_from_iterator(text, trainer=tk.trainers.BpeTrainer(vocab_size=target, show_progress=False))
    pieces = _wordpiece_pieces(bpe.get_vocab())
    fill = [f"[unused{i}]" for i in range(budget - len(pieces))]
    tokens = list(SPECIAL_TOKENS) + sorted(pieces) + fill
    return _tokenizer_from_vocab({piece: i for i, piece in enumerate(tokens)})


def _tokenizer_from_vocab(vocab: dict[str, int]) -> Any:
    tk = require_tokenizers()
    tokenizer = tk.Tokenizer(tk.models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = tk.decoders.WordPiece()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _ptb_sentences(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.strip().replace("<unk>", "[UNK]") for line in handle]


def make_pair_example(rng: np.random.Generator, sentences: RaggedArray, *, length: int, vocab_size: int,
                      mlm_probability: float, max_predictions: int, ordered: bool = True) -> dict[str, Any]:
    """One masked ``[CLS] A [SEP] B [SEP]`` example (numpy arrays) drawn from ``rng``.

    ``ordered=False`` (sentences without document order): B always comes from a
    random place and the next-sentence target is ``NSP_IGNORE``.
    """
    n = len(sentences)
    budget = length - 3
    start = int(rng.integers(0, n - 1))
    a_target = int(rng.integers(1, budget // 2 + 1))
    a: list[np.ndarray] = []
    a_len, index = 0, start
    while index < n - 1 and (not a or a_len < a_target):
        a.append(sentences[index])
        a_len += len(a[-1])
        index += 1
    not_next = bool(rng.random() < 0.5) or not ordered
    if not_next:  # a random place outside A and where A continues
        index = int(rng.integers(0, n - 1))
        while start <= index <= start + len(a):
            index = int(rng.integers(0, n - 1))
    b: list[np.ndarray] = []
    b_len = 0
    while index < n and (not b or a_len + b_len < budget):
        b.append(sentences[index])
        b_len += len(b[-1])
        index += 1
    tokens_a, tokens_b = list(np.concatenate(a)), list(np.concatenate(b))
    while len(tokens_a) + len(tokens_b) > budget:   # trim the longer side from its end
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
    ids = np.full(length, PAD, dtype=np.int64)
    segments = np.zeros(length, dtype=np.int64)
    pair = [CLS, *tokens_a, SEP, *tokens_b, SEP]
    ids[:len(pair)] = pair
    segments[len(tokens_a) + 2:len(pair)] = 1
    candidates = np.array([i for i in range(1, len(pair) - 1) if i != len(tokens_a) + 1])
    count = min(max_predictions, max(1, int(round(len(candidates) * mlm_probability))))
    chosen = np.sort(rng.choice(candidates, size=count, replace=False))
    positions = np.zeros(max_predictions, dtype=np.int64)
    targets = np.zeros(max_predictions, dtype=np.int64)
    positions[:count], targets[:count] = chosen, ids[chosen]
    action = rng.random(count)
    random_ids = rng.integers(len(SPECIAL_TOKENS), vocab_size, size=count)
    ids[chosen] = np.where(action < 0.8, MASK, np.where(action < 0.9, random_ids, ids[chosen]))
    return {"inputs": ids, "segment_ids": segments, "mlm_positions": positions, "targets": targets,
            "nsp_targets": np.int64(not_next if ordered else NSP_IGNORE)}


class _PairBatches:
    """``rng -> batch`` of masked sentence pairs (picklable, for data workers)."""

    def __init__(self, sentences: RaggedArray, a: BertPretrainHParams, batch_size: int, length: int,
                 ordered: bool) -> None:
        self.sentences, self.a, self.batch_size, self.length = sentences, a, batch_size, length
        self.ordered = ordered

    def __call__(self, rng: np.random.Generator) -> Batch:
        rows = [make_pair_example(rng, self.sentences, length=self.length, vocab_size=VOCAB_SIZE,
                                  mlm_probability=self.a.mlm_probability,
                                  max_predictions=self.a.max_predictions, ordered=self.ordered)
                for _ in range(self.batch_size)]
        return {key: torch.from_numpy(np.stack([row[key] for row in rows])) for key in rows[0]}


class BertPretrainProblem(PreparedProblem):
    """Masked-LM + next-sentence pairs from a text corpus's sentences (WordPiece ids).

    Subclasses give ``_raw_text()`` (split -> sentences, ``[UNK]`` for unknown
    words) and ``ordered`` (whether consecutive sentences continue each other).
    """

    task: ClassVar[str] = "pretrain"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    default_hparams: ClassVar[str] = "bert_small"
    ordered: ClassVar[bool] = True

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir, raw_dir)
        self._sentences: dict[str, RaggedArray] = {}
        self._tokenizer: Any = None

    def _raw_text(self) -> dict[str, list[str]]:
        raise NotImplementedError

    @staticmethod
    def _hp(hp: HParams) -> BertPretrainHParams:
        return hp if isinstance(hp, BertPretrainHParams) else BertPretrainHParams()

    @staticmethod
    def length(hp: HParams) -> int:
        return hp.max_length if hp.max_length > 0 else DEFAULT_LENGTH

    def spec(self, hp: HParams) -> ProblemSpec:
        a = self._hp(hp)
        return ProblemSpec(task="pretrain", input_vocab_size=VOCAB_SIZE, target_vocab_size=VOCAB_SIZE,
                           max_input_length=self.length(hp), max_target_length=a.max_predictions, pad_id=PAD)

    def _generate(self) -> None:
        assert self.data_dir is not None and self.raw_dir is not None
        require_tokenizers()
        text = self._raw_text()
        tokenizer = train_wordpiece(text["train"], VOCAB_SIZE)
        writer = ShardWriter(self.data_dir, self.name, self.config)
        counts = {}
        for split in SPLITS:
            ids = [e.ids for e in tokenizer.encode_batch(text[split])]
            ids = [s for s in ids if s]                       # drop empty lines
            flat, offsets = ragged_to_arrays(ids, np.int32)
            writer.add_array(f"{split}.tokens.npy", flat)
            writer.add_array(f"{split}.offsets.npy", offsets)
            counts[split] = {"sentences": len(ids), "pieces": int(len(flat))}
        vocab = tokenizer.get_vocab()
        writer.add_text("vocab.json", json.dumps(sorted(vocab, key=vocab.get)))
        writer.finish({"vocab_size": len(vocab), "splits": counts})
        self._sentences.clear()
        self._tokenizer = None

    def sentences(self, split: str) -> RaggedArray:
        """The WordPiece ids of every sentence of ``split``."""
        if split not in SPLIT_SEEDS:
            raise ValueError(f"unknown split {split!r}; use train, valid or test")
        if split not in self._sentences:
            manifest = self._ensure_prepared()
            assert self.data_dir is not None
            self._sentences[split] = RaggedArray(open_array(self.data_dir, f"{split}.tokens.npy", manifest),
                                                 open_array(self.data_dir, f"{split}.offsets.npy", manifest),
                                                 f"{self.data_dir}/{split}")
        return self._sentences[split]

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._ensure_prepared()
            assert self.data_dir is not None
            pieces = json.loads((self.data_dir / "vocab.json").read_text(encoding="utf-8"))
            self._tokenizer = _tokenizer_from_vocab({p: i for i, p in enumerate(pieces)})
        return self._tokenizer

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        a = self._hp(hp)
        length = self.length(hp)
        if length < 8:
            raise HParamsError(f"{self.name}: max_length={length} is too short for a sentence pair")
        make_batch = _PairBatches(self.sentences(split), a, hp.batch_size, length, self.ordered)
        return generated_reader(make_batch, split, hp, train_examples=a.train_examples,
                                eval_examples=a.eval_examples, seed=a.seed + seed, workers=workers,
                                problem=self.name)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text.replace("<unk>", "[UNK]")).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != PAD], skip_special_tokens=False)


@problems.register("bert_pretrain_ptb")
class BertPretrainPTB(BertPretrainProblem):
    """PTB sentences in their original order (so "is next" pairs are real continuations)."""

    config: ClassVar[dict[str, Any]] = {"format": "bert-ptb-wordpiece-v2", "md5": PTB_MD5,
                                        "vocab_size": VOCAB_SIZE, "special_tokens": list(SPECIAL_TOKENS)}

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir or default_data_dir("bert_pretrain_ptb"), raw_dir or default_raw_dir("ptb"))

    def _raw_text(self) -> dict[str, list[str]]:
        assert self.raw_dir is not None
        paths = fetch_ptb(self.raw_dir)
        return {split: _ptb_sentences(paths[split]) for split in SPLITS}


@problems.register("bert_pretrain_multi30k")
class BertPretrainMulti30k(BertPretrainProblem):
    """The English side of Multi30k (lower-cased image captions). Captions do not continue
    one another, so pairs are random and the next-sentence target is ignored (MLM only)."""

    ordered: ClassVar[bool] = False

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir or default_data_dir("bert_pretrain_multi30k"),
                         raw_dir or default_raw_dir("multi30k"))

    config: ClassVar[dict[str, Any]] = {"format": "bert-multi30k-en-wordpiece-v1", "sha256": MULTI30K_SHA256,
                                        "vocab_size": VOCAB_SIZE, "special_tokens": list(SPECIAL_TOKENS)}

    def _raw_text(self) -> dict[str, list[str]]:
        assert self.raw_dir is not None
        paths = fetch_multi30k(self.raw_dir)
        return {split: [line.lower() for line in _read_lines(paths[f"{SPLIT_FILES[split]}.en.gz"])]
                for split in SPLITS}
