"""Your own problem, model and hparams set: a character-level Caesar cipher read from CSV files.

Everything here registers itself, so the ``hotloop`` command can use it through ``--import``::

    python examples/write_char_data.py /tmp/caesar          # makes train.csv and valid.csv
    hotloop train --import examples/char_components.py --problem char_caesar \
        --model char_tagger --hparams char_tagger_small --data-dir /tmp/caesar

- ``char_caesar`` (a Problem) reads ``<data_dir>/{train,valid}.csv`` with columns
  ``source,target`` (lowercase words) and turns each word into character ids.
- ``char_tagger`` (a SequenceModel) predicts one output character per input character:
  embedding -> 1-D convolution -> ReLU -> linear.
- ``char_tagger_small`` (an hparams set) returns :class:`CharTaggerHParams`, the shared
  :class:`~hotloop.hparams.HParams` fields plus this model's ``kernel_size``.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hotloop.data import from_arrays
from hotloop.errors import UserError
from hotloop.hparams import HParams
from hotloop.models.base import SequenceModel
from hotloop.problems.base import Problem, ProblemSpec
from hotloop.registry import hparams_sets, models, problems

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
FIRST_ID = 2                       # id 0 is padding, id 1 is end-of-sequence
VOCAB_SIZE = FIRST_ID + len(ALPHABET)


def encode(word: str) -> list[int]:
    """``"abc"`` -> ``[2, 3, 4]``."""
    return [FIRST_ID + ALPHABET.index(c) for c in word]


def decode(ids: Any) -> str:
    return "".join(ALPHABET[int(i) - FIRST_ID] for i in ids if int(i) >= FIRST_ID)


@dataclass(frozen=True)
class CharTaggerHParams(HParams):
    kernel_size: int = 3           # width of the convolution (odd: the output stays aligned)


@hparams_sets.register("char_tagger_small")
def char_tagger_small() -> CharTaggerHParams:
    return CharTaggerHParams(batch_size=32, hidden_size=64, learning_rate=3e-3, max_steps=300)


@problems.register("char_caesar")
class CharCaesar(Problem):
    """Words and their encryption, one pair per CSV row (``source,target``)."""

    task = "seq2seq"
    default_hparams = "char_tagger_small"

    def spec(self, hp: HParams) -> ProblemSpec:
        return ProblemSpec(task="seq2seq", input_vocab_size=VOCAB_SIZE, target_vocab_size=VOCAB_SIZE)

    def _csv(self, split: str) -> Path:
        if self.data_dir is None:
            raise UserError("char_caesar reads <data_dir>/train.csv and valid.csv: pass --data-dir DIR "
                            "(python examples/write_char_data.py DIR writes them)")
        return self.data_dir / f"{split}.csv"

    def prepare(self) -> None:
        """Nothing to generate: the CSV files are the data; check they are there."""
        for split in ("train", "valid"):
            if not self._csv(split).is_file():
                raise UserError(f"char_caesar: {self._csv(split)} is missing")

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> Any:
        with open(self._csv(split), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        inputs, targets = [encode(r["source"]) for r in rows], [encode(r["target"]) for r in rows]
        reader = from_arrays({"inputs": inputs, "targets": targets})
        if shuffle if shuffle is not None else split == "train":
            reader = reader.shuffle(len(rows), seed=hp.seed + seed)
        return reader.batch(hp.batch_size)      # pads each batch to its longest word with id 0

    def decode(self, ids: Any) -> str:
        return decode(ids)


@models.register("char_tagger")
class CharTagger(SequenceModel):
    """One output character per input character: embedding -> conv -> ReLU -> linear."""

    tasks = ("seq2seq",)
    hparams_class = CharTaggerHParams

    def __init__(self, hp: CharTaggerHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        self.embed = nn.Embedding(spec.input_vocab_size, hp.hidden_size)
        self.conv = nn.Conv1d(hp.hidden_size, hp.hidden_size, hp.kernel_size, padding=hp.kernel_size // 2)
        self.out = nn.Linear(hp.hidden_size, spec.target_vocab_size)

    def forward(self, batch: dict[str, torch.Tensor], state: Any = None) -> tuple[torch.Tensor, Any]:
        x = self.embed(batch["inputs"])                        # [B, T, H]
        x = torch.relu(self.conv(x.transpose(1, 2)))           # [B, H, T]
        return self.out(x.transpose(1, 2)), None               # [B, T, V]
