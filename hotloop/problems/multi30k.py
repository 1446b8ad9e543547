"""Multi30k task 1 German -> English translation (WMT16 multimodal, text only).

Raw files ``{train,val,test_2016_flickr}.{de,en}.gz`` (29,000 / 1,014 /
1,000 pairs) are verified by sha256 and downloaded when absent. Datagen,
vocabulary (ids 0 = pad, 1 = EOS, 2 = unk) and readers are
:class:`~hotloop.problems.translation.SubwordTranslation`'s.
"""
from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..data.download import default_data_dir, default_raw_dir, download, verify_file
from ..data.errors import DataError
from ..registry import hparams_sets, problems
from .translation import Seq2SeqHParams, SubwordTranslation

__all__ = ["Multi30kDeEn", "Multi30kHParams", "transformer_multi30k", "MULTI30K_SHA256",
           "MULTI30K_PAIRS", "MULTI30K_URL", "fetch_multi30k"]

log = logging.getLogger(__name__)

SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
MULTI30K_PAIRS = {"train": 29_000, "valid": 1_014, "test": 1_000}
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
VOCAB_SIZE = 8000
DEFAULT_MAX_LENGTH = 128


@dataclass(frozen=True)
class Multi30kHParams(Seq2SeqHParams):
    """Seq2seq fields (tied/shared embeddings) with a 4096-token default batch budget."""

    batch_tokens: int = 4096      # padded tokens per batch (per field); 0 = batch_size * 32


@hparams_sets.register("transformer_multi30k")
def transformer_multi30k() -> Multi30kHParams:
    """A small pre-norm Transformer for Multi30k on CPU: 3+3 layers, d 256, one shared 8k BPE vocabulary
    with shared source/target embeddings tied to the output layer (about 8M parameters)."""
    return Multi30kHParams(hidden_size=256, num_layers=3, num_heads=4, filter_size=1024, dropout=0.1,
                           tie_embeddings=True, shared_embeddings=True,
                           label_smoothing=0.1, batch_tokens=4096, optimizer="adam", learning_rate=1e-3,
                           adam_beta2=0.98, lr_schedule="rsqrt_decay", warmup_steps=1000,
                           max_grad_norm=1.0, max_epochs=20)


def fetch_multi30k(raw_dir: str | Path, *, base_url: str = MULTI30K_URL) -> dict[str, Path]:
    """Make the six ``.gz`` files present in ``raw_dir`` (downloading what is missing), sha256-verified."""
    raw_dir = Path(raw_dir)
    paths = {}
    for name, sha in MULTI30K_SHA256.items():
        path = raw_dir / name
        if not path.is_file():
            download(base_url + name, path, expected=sha)
        verify_file(path, sha)
        paths[name] = path
    return paths


def _read_lines(path: Path) -> list[str]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return [line.strip() for line in handle.read().splitlines()]
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read gzip text ({exc})") from exc


@problems.register("translate_multi30k_de_en")
class Multi30kDeEn(SubwordTranslation):
    """German -> English; batches ``{"inputs": [B, S], "targets": [B, T]}`` int64, 0-padded."""

    default_hparams: ClassVar[str] = "transformer_multi30k"
    model_hparams: ClassVar[Mapping[str, str]] = {"transformer": "transformer_multi30k",
                                                  "lstm_seq2seq": "lstm_seq2seq_multi30k"}
    vocab_size: ClassVar[int] = VOCAB_SIZE
    default_max_length: ClassVar[int] = DEFAULT_MAX_LENGTH
    config: ClassVar[dict[str, Any]] = {"format": "multi30k-spm-bpe-v1", "sha256": MULTI30K_SHA256,
                                        "vocab_size": VOCAB_SIZE, "shared_vocab": True}

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir or default_data_dir("translate_multi30k_de_en"),
                         raw_dir or default_raw_dir("multi30k"))

    def _generate(self) -> None:
        """Verify/download the raw files, train the subword vocabulary, write the shards."""
        text = {split: self.split_text(split) for split in SPLIT_FILES}
        for split, fields in text.items():
            de, en = fields["inputs"], fields["targets"]
            if len(de) != len(en) or len(de) != MULTI30K_PAIRS[split]:
                raise DataError(f"{self.raw_dir}/{SPLIT_FILES[split]}.{{de,en}}.gz: {len(de)} / {len(en)} lines, "
                                f"expected {MULTI30K_PAIRS[split]} pairs")
        self.write_shards(text)

    def split_text(self, split: str) -> dict[str, list[str]]:
        """The raw (detokenized) text of ``split``: ``{"inputs": German, "targets": English}``,
        one stripped line per pair in file order (BLEU references come from here)."""
        if split not in SPLIT_FILES:
            raise ValueError(f"unknown split {split!r}; use train, valid or test")
        assert self.raw_dir is not None
        paths = fetch_multi30k(self.raw_dir)
        stem = SPLIT_FILES[split]
        return {"inputs": _read_lines(paths[f"{stem}.de.gz"]), "targets": _read_lines(paths[f"{stem}.en.gz"])}
