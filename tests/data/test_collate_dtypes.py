"""Collation keeps dtypes (uint8, int32, bool), pads ragged rows, keeps strings as lists; HF columns too."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hotloop.data import collate
from hotloop.data.hf_sources import ArrowFetch, derived_sizes
from hotloop.errors import UserError
from hotloop.hparams import HParams
from hotloop.problems.base import ProblemSpec
from hotloop.problems.datasets import problem_from_data
from hotloop.train import Trainer


def _items():
    return [{"image": torch.full((1, 2, 2), 200, dtype=torch.uint8), "ids": np.arange(n + 1, dtype=np.int32),
             "mask": torch.tensor([True] * (n + 1)), "score": 0.5 * n, "label": n, "text": f"row {n}"}
            for n in range(3)]


def test_keep_dtypes_stacks_pads_and_passes_strings():
    batch = collate(_items(), pad_id=0, keep_dtypes=True)
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (3, 1, 2, 2)
    assert batch["ids"].dtype == torch.int32 and batch["ids"].tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 2]]
    assert batch["mask"].dtype == torch.bool and batch["mask"].tolist()[0] == [True, False, False]
    assert batch["score"].dtype == torch.get_default_dtype() and batch["label"].dtype == torch.int64
    assert batch["text"] == ["row 0", "row 1", "row 2"]


def test_the_token_batches_of_built_in_problems_stay_int64():
    batch = collate(_items(), pad_id=0)
    assert batch["ids"].dtype == batch["mask"].dtype == batch["image"].dtype == torch.int64


def _hf():
    import datasets
    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict({"pixels": np.full((3, 2, 2), 7, dtype=np.uint8),
                                     "ids": [[1, 2], [3], [4, 5, 6]], "flags": [[True], [False], [True]],
                                     "label": np.array([0, 1, 2], dtype=np.int32), "text": ["a", "b", "c"]})
    return ds.cast_column("ids", datasets.Sequence(datasets.Value("int32")))


def test_hf_columns_become_tensors_of_their_own_dtype():
    batch = ArrowFetch(_hf(), pad_id=0)([2, 0])
    assert batch["pixels"].dtype == torch.uint8 and batch["pixels"].shape == (2, 2, 2)
    assert batch["ids"].dtype == torch.int32 and batch["ids"].tolist() == [[4, 5, 6], [1, 2, 0]]
    assert batch["flags"].dtype == torch.bool and batch["label"].dtype == torch.int32
    assert batch["label"].tolist() == [2, 0] and batch["text"] == ["c", "a"]
    renamed = ArrowFetch(_hf(), columns={"inputs": "ids", "targets": "label"})([1])
    assert set(renamed) == {"inputs", "targets"}
    torch_format = ArrowFetch(_hf().with_format("torch"))([0, 1])     # the owner's format is honoured
    assert torch_format["ids"].tolist() == [[1, 2], [3, 0]] and torch_format["text"] == ["a", "b"]


def test_spec_sizes_are_derived_from_an_hf_dataset_and_images_need_none():
    assert derived_sizes(_hf(), {"inputs": "ids", "targets": "label"}) == {
        "input_vocab_size": 7, "max_input_length": 3, "target_vocab_size": 3}
    assert problem_from_data(_hf(), columns={"inputs": "ids"}, task="lm").spec(HParams()).input_vocab_size == 7
    images = problem_from_data(_hf(), columns={"inputs": "pixels", "targets": "label"})
    assert images.spec(HParams()).input_vocab_size == 0       # nothing required for image data


def test_a_loader_batch_keeps_dtypes_through_the_reader():
    loader = DataLoader(_items(), batch_size=3, collate_fn=lambda items: collate(items, keep_dtypes=True))
    batch = next(iter(problem_from_data(loader).reader("train", HParams())))
    assert batch["image"].dtype == torch.uint8 and batch["ids"].dtype == torch.int32 and batch["text"][0] == "row 0"


def test_strings_where_a_token_model_reads_ids_are_one_line_errors():
    problem = problem_from_data(_hf(), columns={"inputs": "text", "targets": "label"},
                                spec=ProblemSpec(task="classify", input_vocab_size=8, target_vocab_size=3))
    with pytest.raises(UserError, match="column 'inputs' holds strings") as caught:
        next(iter(problem.reader("train", HParams(batch_size=2))))
    assert "\n" not in str(caught.value)
    trainer = Trainer(problem, torch.nn.Linear(1, 1), HParams(batch_size=2), max_steps=1, loggers=[])
    with pytest.raises(UserError, match="column 'inputs' holds strings") as caught:   # through the prefetch thread
        trainer.fit()
    assert "\n" not in str(caught.value)
    custom = problem_from_data(_hf(), columns={"inputs": "text"})          # a model of your own may take them
    assert next(iter(custom.reader("train", HParams(batch_size=2), shuffle=False)))["inputs"] == ["a", "b"]


def test_a_batch_that_is_neither_dict_pair_nor_tensor_is_refused():
    triples = DataLoader([(1, 2, 3)] * 4, batch_size=2)
    with pytest.raises(UserError, match="a batch is a 3-tuple"):
        next(iter(problem_from_data(triples).reader("train", HParams())))
