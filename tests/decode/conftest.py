"""Fixtures of the decode tests: tiny real seq2seq models and a tiny WMT-style fixture over local HTTP."""
from __future__ import annotations

import pytest
import torch

from hotloop.hparams import get_hparams
from hotloop.problems.base import ProblemSpec


@pytest.fixture
def tiny_seq2seq():
    """Build a tiny untrained seq2seq model by name, in eval mode (float64 unless asked)."""
    from hotloop.registry import models

    def build(name: str, hparams: str, *, dtype=torch.float64, vocab: int = 30, max_len: int = 24, seed: int = 0,
              **overrides):
        hp = get_hparams(hparams).replace(hidden_size=32, num_heads=4, filter_size=64, num_layers=2,
                                          **overrides)
        spec = ProblemSpec("seq2seq", vocab, vocab, max_len, max_len)
        torch.manual_seed(seed)
        return models.get(name)(hp, spec).to(dtype).eval()
    return build


# -- a tiny WMT-style fixture served over local HTTP -------------------------------------------------
EN_WORDS = ["the", "house", "is", "small", "a", "man", "sees", "dog", "big", "red", "car", "woman", "runs",
            "green", "tree", "child", "reads", "book", "old", "new"]
DE_WORDS = ["das", "Haus", "ist", "klein", "ein", "Mann", "sieht", "Hund", "groß", "rot", "Auto", "Frau", "läuft",
            "grün", "Baum", "Kind", "liest", "Buch", "alt", "neu"]
TINY_VOCAB = 80


def tiny_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        idx = torch.randint(0, len(EN_WORDS), (int(torch.randint(3, 8, (1,), generator=gen)),), generator=gen)
        pairs.append((" ".join(EN_WORDS[i] for i in idx).capitalize() + ".",
                      " ".join(DE_WORDS[i] for i in idx).capitalize() + "."))
    return pairs


def write_wmt_fixture(root) -> dict[str, list[tuple[str, str]]]:
    """news-commentary TSV (de<TAB>en, with one one-sided line), dev.tgz (plain newstest2013) and
    test-full.tgz (SGML newstest2014)."""
    import gzip
    import io
    import tarfile
    splits = {"train": tiny_pairs(120, 0), "valid": tiny_pairs(6, 1), "test": tiny_pairs(5, 2)}
    lines = [f"{de}\t{en}" for en, de in splits["train"]]
    lines.insert(3, "Nur Deutsch.\t")
    with gzip.open(root / "news-commentary-v14.de-en.tsv.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")

    def sgm(texts):
        segs = "".join(f'<seg id="{i + 1}">{t}</seg>\n' for i, t in enumerate(texts))
        return f'<srcset setid="newstest2014">\n<doc docid="d1">\n{segs}</doc>\n</srcset>\n'

    archives = {"dev.tgz": {"dev/newstest2013.en": "\n".join(en for en, _ in splits["valid"]) + "\n",
                            "dev/newstest2013.de": "\n".join(de for _, de in splits["valid"]) + "\n"},
                "test-full.tgz": {"test-full/newstest2014-deen-src.en.sgm": sgm(en for en, _ in splits["test"]),
                                  "test-full/newstest2014-deen-ref.de.sgm": sgm(de for _, de in splits["test"])}}
    for archive, members in archives.items():
        with tarfile.open(root / archive, "w:gz") as tar:
            for name, text in members.items():
                data = text.encode("utf-8")
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return splits


@pytest.fixture
def tiny_wmt(http_dir, tmp_path, monkeypatch):
    """The WMT problem class pointed at fixture files on a local server (pinned sha256, small vocabulary)."""
    from hotloop.data.download import file_digest
    from hotloop.problems.wmt import RawFile, TranslateWmtEnDe
    root, base_url = http_dir
    splits = write_wmt_fixture(root)
    table = {name: RawFile(base_url + name, file_digest(root / name))
             for name in ("news-commentary-v14.de-en.tsv.gz", "dev.tgz", "test-full.tgz")}
    monkeypatch.setattr(TranslateWmtEnDe, "raw_files", table)
    monkeypatch.setattr(TranslateWmtEnDe, "vocab_size", TINY_VOCAB)
    return TranslateWmtEnDe, splits, tmp_path
