"""problem_from_data: Datasets, lists and iterables as problems (batching, padding, shuffling, resume)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from hotloop.errors import UserError
from hotloop.hparams import HParams
from hotloop.problems.base import ProblemSpec
from hotloop.problems.datasets import problem_from_data

SPEC = ProblemSpec(task="seq2seq", input_vocab_size=20, target_vocab_size=20)
HP = HParams(batch_size=4)


class Pairs(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return [i + 2] * (1 + i % 3), [i + 2]


def _rows(batches):
    return [row.tolist() for b in batches for row in b["inputs"]]


def test_dataset_batches_are_padded_and_complete():
    problem = problem_from_data(Pairs(), valid=[{"inputs": [3, 4], "targets": [5]}], spec=SPEC)
    batches = list(problem.reader("train", HP, shuffle=False))
    assert [b["inputs"].shape for b in batches] == [(4, 3), (4, 3), (2, 3)]
    assert batches[0]["inputs"][0].tolist() == [2, 0, 0] and batches[0]["targets"][:, 0].tolist() == [2, 3, 4, 5]
    assert problem.eval_splits == ("valid",)
    assert list(problem.reader("valid", HP))[0]["inputs"].tolist() == [[3, 4]]


def test_train_shuffle_is_a_seeded_permutation_and_resumes():
    problem = problem_from_data(Pairs(), spec=SPEC)
    first = [row[0] for row in _rows(problem.reader("train", HP))]
    assert sorted(first) == list(range(2, 12)) and first != list(range(2, 12))
    assert first == [row[0] for row in _rows(problem.reader("train", HP))]     # same seed, same order
    reader = problem.reader("train", HP)
    it = iter(reader)
    next(it)
    state = reader.state_dict()
    again = problem.reader("train", HP)
    again.load_state_dict(state)
    assert [row[0] for row in _rows(again)] == first[4:]


def test_iterables_functions_and_one_shot_iterators():
    examples = [{"inputs": [i + 2], "targets": [i + 2]} for i in range(6)]
    from_list_fn = problem_from_data(lambda: iter(examples), spec=SPEC)
    assert _rows(from_list_fn.reader("train", HP, shuffle=False)) == [[i + 2] for i in range(6)]
    assert from_list_fn.eval_splits == ()
    with pytest.raises(UserError, match="one-shot iterator"):
        problem_from_data(iter(examples), spec=SPEC)
    with pytest.raises(UserError, match="no 'valid' data"):
        from_list_fn.reader("valid", HP)
    assert torch.is_tensor(next(iter(from_list_fn.reader("train", HP)))["targets"])
