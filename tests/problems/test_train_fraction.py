"""``train_fraction``: a fixed part of Multi30k's training pairs, alone and in a multi-problem run.

The train split at 0.1 is ``round(0.1 * 29000) = 2900`` pairs of the full split, the same ones
for every reader, epoch, seed and resume; valid and the vocabulary do not change; a fraction
outside (0, 1] is a one-line user error.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import sentencepiece  # noqa: F401 - in the [test] extra: a missing one is a failure, not a skip

from helpers import raw_data_dir, require_raw_data
from hotloop import cli
from hotloop.data import from_shards
from hotloop.errors import UserError
from hotloop.hparams import HParamsError, get_hparams
from hotloop.problems.multi30k import MULTI30K_PAIRS, Multi30kDeEn
from hotloop.problems.translation import train_subset
from hotloop.compose.build import build_run, resolve_names

RAW = raw_data_dir("multi30k")
NAME = "translate_multi30k_de_en"
TENTH = round(0.1 * MULTI30K_PAIRS["train"])   # 2900: Python round (nearest), at least 1

Pair = tuple[bytes, bytes]


@pytest.fixture(scope="module", autouse=True)
def m30k_raw_data() -> Path:
    """Every test here needs the raw files: skipped without them, failed under CI=true."""
    return require_raw_data(RAW / "train.de.gz", "Multi30k")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multi-problem data root whose Multi30k folder is prepared (the full-data run's)."""
    root = tmp_path_factory.mktemp("fraction_data")
    Multi30kDeEn(data_dir=root / NAME, raw_dir=RAW).prepare()
    return root


@pytest.fixture(scope="module")
def m30k(data_root: Path) -> Multi30kDeEn:
    return Multi30kDeEn(data_dir=data_root / NAME, raw_dir=RAW)


def _hp(**kw):
    return get_hparams("transformer_multi30k", kw)


def _pairs(batches) -> Counter[Pair]:
    """Every (source, target) pair of ``batches``, padding removed, as a multiset."""
    out: Counter[Pair] = Counter()
    for b in batches:
        for src, tgt in zip(b["inputs"], b["targets"]):
            out[(src[src != 0].numpy().tobytes(), tgt[tgt != 0].numpy().tobytes())] += 1
    return out


def _order(batches) -> list[Pair]:
    return [(s[s != 0].numpy().tobytes(), t[t != 0].numpy().tobytes())
            for b in batches for s, t in zip(b["inputs"], b["targets"])]


def test_subset_indices_rounding_and_nesting():
    assert len(train_subset(29_000, 0.1)) == 2900
    assert len(train_subset(29_000, 0.00001)) == 1            # at least one pair
    assert len(train_subset(10, 0.25)) == 2                   # round(2.5) = 2 (ties to even)
    assert np.array_equal(train_subset(7, 1.0), np.arange(7))
    tenth, fifth = train_subset(29_000, 0.1), train_subset(29_000, 0.2)
    assert np.all(np.diff(tenth) > 0) and set(tenth) <= set(fifth)   # ascending, nested
    assert np.array_equal(tenth, train_subset(29_000, 0.1))


def test_tenth_is_a_fixed_subset_of_the_full_train_split(m30k):
    full = _pairs(m30k.reader("train", _hp(), shuffle=False))
    assert sum(full.values()) == MULTI30K_PAIRS["train"]
    tenth = _pairs(m30k.reader("train", _hp(train_fraction=0.1)))
    assert sum(tenth.values()) == TENTH
    assert not tenth - full                                   # every kept pair is a training pair
    source = from_shards(m30k.data_dir, "train")
    expected: Counter[Pair] = Counter()
    for i in train_subset(len(source), 0.1):
        item = source._get(0, int(i))
        expected[(item["inputs"].astype(np.int64).tobytes(), item["targets"].astype(np.int64).tobytes())] += 1
    assert tenth == expected                                  # exactly the documented indices


def test_same_pairs_for_every_reader_epoch_seed_and_resume(m30k):
    hp = _hp(train_fraction=0.1)
    reader = m30k.reader("train", hp)
    epoch0, epoch1 = list(reader), list(reader)
    again = list(m30k.reader("train", hp))
    assert _order(epoch0) == _order(again)                    # two readers: the same batches
    assert _order(epoch0) != _order(epoch1)                   # reshuffled per epoch ...
    assert _pairs(epoch0) == _pairs(epoch1)                   # ... over the same pairs
    other_seed = m30k.reader("train", _hp(train_fraction=0.1, seed=7), seed=3)
    assert _pairs(other_seed) == _pairs(epoch0)
    resumed = m30k.reader("train", hp)
    it = iter(resumed)
    for _ in range(4):
        next(it)
    state = resumed.state_dict()
    fresh = m30k.reader("train", hp)
    fresh.load_state_dict(state)
    assert _order(fresh) == _order(epoch0[4:])


def test_valid_and_test_are_whole_and_unchanged(m30k):
    for split in ("valid", "test"):
        full = list(m30k.reader(split, _hp()))
        tenth = list(m30k.reader(split, _hp(train_fraction=0.1)))
        assert sum(b["inputs"].shape[0] for b in tenth) == MULTI30K_PAIRS[split]
        assert _order(full) == _order(tenth)


def test_vocabulary_is_the_full_runs(m30k, tmp_path):
    """A folder prepared for a 10% run holds the vocabulary a full run's datagen trains."""
    model = (m30k.data_dir / "subwords.model").read_bytes()
    other = Multi30kDeEn(data_dir=tmp_path / NAME, raw_dir=RAW)
    next(iter(other.reader("train", _hp(train_fraction=0.1))))   # datagen happens on first use
    assert (other.data_dir / "subwords.model").read_bytes() == model
    assert other.encoder.vocab_size == m30k.encoder.vocab_size == 8000
    line = "Zwei Männer stehen am Strand."
    assert other.encoder.encode(line) == m30k.encoder.encode(line)


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.1", "nan"])
def test_bad_fraction_is_a_clear_error(bad):
    for hparams in ("transformer_multi30k", "multimodel_base"):
        with pytest.raises(HParamsError, match=r"train_fraction=.* must be in \(0, 1\]") as info:
            get_hparams(hparams, f"train_fraction={bad}")
        assert isinstance(info.value, UserError)


def test_bad_fraction_on_the_command_line(capsys):
    code = cli.main(["train", "--problem", NAME, "--override", "train_fraction=1.5", "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hotloop: error: ") and "train_fraction=1.5" in lines[0]


def test_single_problem_runs_read_the_subset(m30k):
    for model, hparams in (("transformer", None), ("multimodel", "multimodel_tiny")):
        problem_cls, _, _, hp = resolve_names(NAME, model, hparams, "train_fraction=0.1")
        assert hp.train_fraction == 0.1
        problem = problem_cls(data_dir=m30k.data_dir if model == "transformer" else m30k.data_dir.parent)
        assert sum(b["inputs"].shape[0] for b in problem.reader("train", hp)) == TENTH


def test_multi_problem_run_cuts_only_the_translation_problem(data_root):
    names = f"{NAME},ptb_lm"
    cut = build_run(names, "multimodel", "multimodel_tiny", "train_fraction=0.1", data_dir=data_root)
    whole = build_run(names, "multimodel", "multimodel_tiny", data_dir=data_root)
    m30k_cut, ptb_cut = cut.problem.reader("train", cut.hp).readers
    m30k_whole, ptb_whole = whole.problem.reader("train", whole.hp).readers
    assert sum(b["inputs"].shape[0] for b in m30k_cut) == TENTH
    assert sum(b["inputs"].shape[0] for b in m30k_whole) == MULTI30K_PAIRS["train"]
    assert len(ptb_cut) == len(ptb_whole)                      # PTB does not read train_fraction
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(ptb_cut, ptb_whole))
    valid = cut.problem.reader(f"valid/{NAME}", cut.hp)
    assert sum(b["inputs"].shape[0] for b in valid) == MULTI30K_PAIRS["valid"]
