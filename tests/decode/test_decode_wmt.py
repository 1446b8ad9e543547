"""The WMT En-De problem on a tiny fixture served over local HTTP: download, checksums, datagen, text."""
from __future__ import annotations

import pytest

from hotloop.data import ChecksumError
from hotloop.hparams import get_hparams
from hotloop.problems.wmt import RawFile, read_sgm


def test_download_datagen_and_splits(tiny_wmt):
    cls, splits, tmp = tiny_wmt
    problem = cls(data_dir=tmp / "data", raw_dir=tmp / "raw")
    problem.prepare()
    assert (tmp / "raw" / "dev.tgz").is_file()
    text = problem.split_text("train")
    assert len(text["inputs"]) == 120 and "Nur Deutsch." not in text["targets"]   # one-sided line dropped
    assert text["inputs"][0] == splits["train"][0][0] and text["targets"][0] == splits["train"][0][1]
    for split in ("valid", "test"):
        got = problem.split_text(split)
        assert list(zip(got["inputs"], got["targets"])) == splits[split]
    assert problem.encoder.vocab_size == 80
    ids = problem.encoder.encode("The old dog runs.")
    assert ids[-1] == 1 and problem.decode(ids) == "The old dog runs."
    hp = get_hparams("transformer_base_small", {"batch_tokens": 256})
    counts = {split: sum(b["inputs"].shape[0] for b in problem.reader(split, hp)) for split in splits}
    assert counts == {"train": 120, "valid": 6, "test": 5}
    assert problem.spec(hp).input_vocab_size == 80


def test_bad_checksum_is_refused_and_nothing_kept(tiny_wmt, monkeypatch):
    cls, _, tmp = tiny_wmt
    table = dict(cls.raw_files)
    table["dev.tgz"] = RawFile(table["dev.tgz"].url, "0" * 64)
    monkeypatch.setattr(cls, "raw_files", table)
    with pytest.raises(ChecksumError, match="dev.tgz"):
        cls(data_dir=tmp / "data", raw_dir=tmp / "raw").prepare()
    assert not (tmp / "raw" / "dev.tgz").exists() and not (tmp / "raw" / "dev.tgz.part").exists()


def test_an_md5_pinned_archive_is_verified_by_md5(tiny_wmt, monkeypatch):
    """The evaluation archives are pinned by the md5 digests sacreBLEU publishes."""
    from hotloop.data.download import file_digest
    cls, _, tmp = tiny_wmt
    table = dict(cls.raw_files)
    first = cls(data_dir=tmp / "data", raw_dir=tmp / "raw")
    first.prepare()                                          # downloads every archive (sha256-pinned)
    md5 = file_digest(tmp / "raw" / "dev.tgz", "md5")
    table["dev.tgz"] = RawFile(table["dev.tgz"].url, md5, "md5")
    monkeypatch.setattr(cls, "raw_files", table)
    cls(data_dir=tmp / "data2", raw_dir=tmp / "raw").prepare()        # the kept file passes by md5
    table["dev.tgz"] = RawFile(table["dev.tgz"].url, "0" * 32, "md5")
    with pytest.raises(ChecksumError, match="dev.tgz"):
        cls(data_dir=tmp / "data3", raw_dir=tmp / "raw").prepare()


def test_read_sgm(tmp_path):
    path = tmp_path / "x.sgm"
    path.write_text('<srcset>\n<doc docid="a">\n<seg id="1"> Hallo Welt. </seg>\n<p>\n<seg id="2">Zwei</seg>\n'
                    '</doc>\n</srcset>\n', encoding="utf-8")
    assert read_sgm(path) == ["Hallo Welt.", "Zwei"]
