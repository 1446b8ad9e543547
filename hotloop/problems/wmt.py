"""WMT English -> German translation at news-commentary size (T2T's ``translate_ende`` workflow).

Training pairs come from News Commentary v14 (about 338k pairs, a de<TAB>en
TSV), validation is newstest2013 (plain text, WMT16 dev archive) and test
newstest2014 (SGML ``<seg>`` lines, WMT14 test archive, as sacreBLEU's wmt14). Datagen
downloads what is missing from :data:`WMT_RAW_FILES`, checks each file's
digest, trains a shared SentencePiece BPE vocabulary on the training text
(ids 0 pad, 1 EOS, 2 unk), appends EOS to every sentence and writes ragged
shards, as :mod:`hotloop.problems.multi30k` does.

Checksums: the two evaluation archives are pinned to the md5 digests that
sacreBLEU publishes for the same URLs (``wmt16/dev``, ``wmt14/full``). The News
Commentary TSV has no published digest: its entry's ``digest`` is ``None``, so
the file is accepted on download and its sha256 is logged so it can be pinned
in :data:`WMT_RAW_FILES`. Tests replace the table (``raw_files``) with fixture
files and their digests served from a local HTTP server.
"""
from __future__ import annotations

import gzip
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..data.download import default_data_dir, default_raw_dir, download, extract_members, file_digest, verify_file
from ..data.errors import DataError
from ..registry import problems
from .translation import SubwordTranslation

__all__ = ["RawFile", "WMT_RAW_FILES", "WMT_EVAL_SETS", "TranslateWmtEnDe", "fetch_raw_files", "read_sgm"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RawFile:
    url: str
    digest: str | None           # hex digest; None: not pinned (accepted, its sha256 logged)
    algorithm: str = "sha256"    # a hashlib name


WMT_RAW_FILES: dict[str, RawFile] = {
    "news-commentary-v14.de-en.tsv.gz": RawFile(
        "https://data.statmt.org/news-commentary/v14/training/news-commentary-v14.de-en.tsv.gz", None),
    "dev.tgz": RawFile("https://data.statmt.org/wmt16/translation-task/dev.tgz",
                       "4a3dc2760bb077f4308cce96b06e6af6", "md5"),
    "test-full.tgz": RawFile("https://statmt.org/wmt14/test-full.tgz", "a8cd784e006feb32ac6f3d9ec7eb389a", "md5"),
}
#: split -> (archive, member holding English, member holding German)
WMT_EVAL_SETS = {"valid": ("dev.tgz", "dev/newstest2013.en", "dev/newstest2013.de"),
                 "test": ("test-full.tgz", "test-full/newstest2014-deen-src.en.sgm",
                          "test-full/newstest2014-deen-ref.de.sgm")}
DEFAULT_MAX_LENGTH = 256
_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


def fetch_raw_files(raw_dir: str | Path, table: dict[str, RawFile]) -> dict[str, Path]:
    """Make every file of ``table`` present in ``raw_dir`` (downloading what is missing), checked."""
    raw_dir = Path(raw_dir)
    paths = {}
    for name, entry in table.items():
        path = raw_dir / name
        if not path.is_file():
            download(entry.url, path, expected=entry.digest, algorithm=entry.algorithm)
        if entry.digest is None:
            log.warning("%s: checksum not pinned; its sha256 is %s", path, file_digest(path))
        else:
            verify_file(path, entry.digest, entry.algorithm)
        paths[name] = path
    return paths


def read_sgm(path: Path) -> list[str]:
    """The ``<seg>`` texts of an SGML test set, in order."""
    text = _read_text(path)
    return [m.group(1).strip() for m in _SEG.finditer(text)]


def _read_text(path: Path) -> str:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read text ({exc})") from exc


def _read_plain(path: Path) -> list[str]:
    return read_sgm(path) if path.suffix == ".sgm" else [line.strip() for line in _read_text(path).splitlines()]


@problems.register("translate_wmt_en_de_nc")
class TranslateWmtEnDe(SubwordTranslation):
    """English -> German; batches ``{"inputs": [B, S], "targets": [B, T]}`` int64, 0-padded."""

    default_hparams: ClassVar[str] = "transformer_base"
    raw_files: ClassVar[dict[str, RawFile]] = WMT_RAW_FILES
    vocab_size: ClassVar[int] = 32_000
    default_max_length: ClassVar[int] = DEFAULT_MAX_LENGTH
    train_file: ClassVar[str] = "news-commentary-v14.de-en.tsv.gz"

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        super().__init__(data_dir or default_data_dir("translate_wmt_en_de_nc"), raw_dir or default_raw_dir("wmt"))

    @property
    def config(self) -> dict[str, Any]:  # type: ignore[override]
        return {"format": "wmt-en-de-spm-bpe-v1", "vocab_size": self.vocab_size, "shared_vocab": True,
                "digests": {name: f"{f.algorithm}:{f.digest}" for name, f in self.raw_files.items()}}

    def split_text(self, split: str) -> dict[str, list[str]]:
        """Raw text of ``split``: ``{"inputs": English, "targets": German}``, one line per pair."""
        assert self.raw_dir is not None
        paths = fetch_raw_files(self.raw_dir, self.raw_files)
        if split == "train":
            english, german = [], []
            for number, line in enumerate(_read_text(paths[self.train_file]).splitlines(), 1):
                fields = line.split("\t")
                if len(fields) != 2:
                    raise DataError(f"{paths[self.train_file]} line {number}: expected de<TAB>en")
                de, en = fields[0].strip(), fields[1].strip()
                if de and en:   # the corpus has unaligned (one-sided) lines
                    english.append(en)
                    german.append(de)
            return {"inputs": english, "targets": german}
        if split not in WMT_EVAL_SETS:
            raise ValueError(f"unknown split {split!r}; use train, valid or test")
        archive, *members = WMT_EVAL_SETS[split]
        out_dir = self.raw_dir / archive.split(".")[0]
        if not all((out_dir / Path(m).name).is_file() for m in members):
            extract_members(paths[archive], {m: Path(m).name for m in members}, out_dir)
        english, german = (_read_plain(out_dir / Path(m).name) for m in members)
        if len(english) != len(german):
            raise DataError(f"{out_dir}: {members[0]} has {len(english)} lines, {members[1]} {len(german)}")
        return {"inputs": english, "targets": german}

    def _generate(self) -> None:
        """Download/verify, train the shared subword vocabulary on the training text, write the shards."""
        self.write_shards({split: self.split_text(split) for split in ("train", "valid", "test")})
