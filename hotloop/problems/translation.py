"""What every subword translation problem shares: hparams, datagen into shards, encoder, readers.

A subclass names its ``vocab_size`` and ``default_max_length``, provides
``split_text(split) -> {"inputs": [...], "targets": [...]}`` (the raw, detokenized
text of a split, also the BLEU references) and a ``config`` for the shard manifest.
Datagen trains one shared SentencePiece BPE vocabulary on the training text,
appends EOS to every sentence and writes each split as ragged shards. Training
batches are length-bucketed with a token budget (T2T style) after a seeded
per-epoch shuffle; eval batches are bucketed without shuffling.

``hp.train_fraction`` < 1 trains on a fixed part of the training pairs (see
:func:`train_subset`); datagen, the vocabulary and the valid/test splits do not
depend on it, so runs with and without it share one prepared folder and vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterable

import numpy as np

from ..data.datagen import write_ragged_split
from ..data.errors import DataError
from ..data.reader import Reader
from ..data.shards import ShardWriter
from ..data.sources import from_shards
from ..hparams import HParams, HParamsError
from .algorithmic import UnknownSplitError
from .base import ProblemSpec
from .prepared import PreparedProblem
from .text_encoders import SubwordEncoder

__all__ = ["Seq2SeqHParams", "SubwordTranslation", "TRAIN_SUBSET_SEED", "check_train_fraction",
           "train_subset"]

TRAIN_SUBSET_SEED = 0  # the permutation that picks a train_fraction subset (independent of hp.seed)


def check_train_fraction(fraction: float) -> float:
    """``fraction`` when ``0 < fraction <= 1``, else an :class:`~hotloop.hparams.HParamsError`."""
    if not 0.0 < fraction <= 1.0:   # also refuses NaN
        raise HParamsError(f"hparam train_fraction={fraction!r} must be in (0, 1]: the part of the "
                           f"training pairs to train on (1 = all)")
    return fraction


@dataclass(frozen=True)
class Seq2SeqHParams(HParams):
    """Encoder-decoder fields on top of :class:`HParams`; ``train_fraction`` is checked on construction
    (so also by ``--override``): outside (0, 1] it is an :class:`~hotloop.hparams.HParamsError`."""

    tie_embeddings: bool = False     # output projection weight = target token embedding
    shared_embeddings: bool = False  # source embedding = target embedding (needs one shared vocabulary)
    batch_tokens: int = 0            # padded tokens per length-bucketed batch (per field); 0 = batch_size * 32
    train_fraction: float = 1.0      # train on this fixed part of the training pairs (train_subset); 1 = all

    def __post_init__(self) -> None:
        check_train_fraction(self.train_fraction)


def train_subset(num_pairs: int, fraction: float) -> np.ndarray:
    """Indices (ascending, int64) of the training pairs kept by ``train_fraction=fraction``.

    The first ``max(1, round(fraction * num_pairs))`` indices (Python ``round``: nearest, ties
    to even) of the fixed permutation ``np.random.default_rng(TRAIN_SUBSET_SEED).permutation(
    num_pairs)``, sorted back into file order. The choice depends on nothing else (not on
    ``hp.seed``, the reader's seed or the epoch), so every epoch, resumed run, seed and
    multi-problem run trains on the same pairs, and a smaller fraction's subset is part of a
    larger one's. ``fraction=1`` keeps every pair.
    """
    check_train_fraction(fraction)
    count = max(1, round(fraction * num_pairs))
    if count >= num_pairs:
        return np.arange(num_pairs, dtype=np.int64)
    order = np.random.default_rng(TRAIN_SUBSET_SEED).permutation(num_pairs)
    return np.sort(order[:count]).astype(np.int64)


class SubwordTranslation(PreparedProblem):
    """Base of translation problems with one shared subword vocabulary."""

    task: ClassVar[str] = "seq2seq"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    vocab_size: ClassVar[int] = 8000
    default_max_length: ClassVar[int] = 128

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir, raw_dir)
        self._encoder: SubwordEncoder | None = None

    def split_text(self, split: str) -> dict[str, list[str]]:
        raise NotImplementedError

    def spec(self, hp: HParams) -> ProblemSpec:
        length = hp.max_length or self.default_max_length
        return ProblemSpec(task="seq2seq", input_vocab_size=self.vocab_size, target_vocab_size=self.vocab_size,
                           max_input_length=length, max_target_length=length)

    def write_shards(self, text: dict[str, dict[str, list[str]]]) -> None:
        """Train the vocabulary on ``text["train"]`` (both sides) and write every split's shards."""
        assert self.data_dir is not None
        train = text["train"]
        encoder = SubwordEncoder.train(train["inputs"] + train["targets"], self.vocab_size)
        writer = ShardWriter(self.data_dir, self.name, self.config)
        encoder.save(self.data_dir / "subwords.model")
        writer.add_file("subwords.model")
        splits = {split: write_ragged_split(writer, split, {field: encoder.encode_many(lines)
                                                            for field, lines in fields.items()})
                  for split, fields in text.items()}
        writer.finish({"vocab_size": encoder.vocab_size, "splits": splits})
        self._encoder = encoder

    @property
    def encoder(self) -> SubwordEncoder:
        if self._encoder is None:
            self._ensure_prepared()
            assert self.data_dir is not None
            self._encoder = SubwordEncoder.load(self.data_dir / "subwords.model")
        return self._encoder

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0, max_tokens: int | None = None) -> Reader:
        """Token-budget batches bucketed by length; training shuffles (seeded per epoch) and drops
        pairs longer than ``max_length``; valid/test keep every pair (an over-long one is an error).

        ``train`` reads only the :func:`train_subset` pairs when ``hp.train_fraction`` < 1 (the
        subset is chosen before the shuffle and the length filter); valid/test ignore it.

        The sentences are already encoded in the shards, so there is no per-batch work for ``workers``.
        """
        if split not in ("train", "valid", "test"):
            raise UnknownSplitError(f"{self.name}: unknown split {split!r}; use train, valid or test")
        manifest = self._ensure_prepared()
        source: Reader = from_shards(self.data_dir, split)
        fraction = getattr(hp, "train_fraction", 1.0)   # checked when the hparams are built
        if split == "train" and fraction < 1.0:
            source = source.select(train_subset(len(source), fraction))
        shuffle = split == "train" if shuffle is None else shuffle
        max_length = hp.max_length or self.default_max_length
        longest = max(manifest["meta"]["splits"][split]["max_length"].values())
        if split != "train" and longest > max_length:
            raise DataError(f"{split} has a {longest}-token sentence, longer than max_length={max_length}; "
                            "raise hp.max_length (eval never drops examples)")
        # hparams that are not Seq2SeqHParams carry no token budget: batch_size * 32
        batch_tokens = hp.batch_tokens if isinstance(hp, Seq2SeqHParams) else 0
        budget = max_tokens or batch_tokens or hp.batch_size * 32
        chain: Reader = source.shuffle(len(source), seed=hp.seed + seed) if shuffle else source
        return chain.bucket(max(budget, max_length), max_length=max_length)

    def decode(self, ids: Iterable[int]) -> str:
        return self.encoder.decode(ids)
