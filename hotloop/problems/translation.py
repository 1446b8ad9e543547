"""What every subword translation problem shares: hparams, datagen into shards, encoder, readers.

A subclass names its ``vocab_size`` and ``default_max_length``, provides
``split_text(split) -> {"inputs": [...], "targets": [...]}`` (the raw, detokenized
text of a split, also the BLEU references) and a ``config`` for the shard manifest.
Datagen trains one shared SentencePiece BPE vocabulary on the training text,
appends EOS to every sentence and writes each split as ragged shards. Training
batches are length-bucketed with a token budget (T2T style) after a seeded
per-epoch shuffle; eval batches are bucketed without shuffling.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterable

from ..data.datagen import write_ragged_split
from ..data.errors import DataError
from ..data.reader import Reader
from ..data.shards import ShardWriter
from ..data.sources import from_shards
from ..hparams import HParams
from .algorithmic import UnknownSplitError
from .base import ProblemSpec
from .prepared import PreparedProblem
from .text_encoders import SubwordEncoder

__all__ = ["Seq2SeqHParams", "SubwordTranslation"]


@dataclass(frozen=True)
class Seq2SeqHParams(HParams):
    """Encoder-decoder fields on top of :class:`HParams`."""

    tie_embeddings: bool = False     # output projection weight = target token embedding
    shared_embeddings: bool = False  # source embedding = target embedding (needs one shared vocabulary)
    batch_tokens: int = 0            # padded tokens per length-bucketed batch (per field); 0 = batch_size * 32


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

        The sentences are already encoded in the shards, so there is no per-batch work for ``workers``.
        """
        if split not in ("train", "valid", "test"):
            raise UnknownSplitError(f"{self.name}: unknown split {split!r}; use train, valid or test")
        manifest = self._ensure_prepared()
        source = from_shards(self.data_dir, split)
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
