import numpy as np
import pytest
import torch

from hotloop.problems.algorithmic import Addition, AlgorithmicHParams, Copy, Reverse, Sort
from hotloop.problems.base import EOS_ID, NUM_RESERVED, PAD_ID

HP = AlgorithmicHParams(batch_size=8, train_length=6, eval_length=6, train_examples=64, eval_examples=16)


def _rows(batch):
    for x, y in zip(batch["inputs"], batch["targets"]):
        x = x[x != PAD_ID] - NUM_RESERVED
        eos = int((y == EOS_ID).nonzero()[0])
        yield x.numpy(), (y[:eos] - NUM_RESERVED).numpy(), y[eos + 1:]


@pytest.mark.parametrize("cls, fn", [(Copy, lambda x: x), (Reverse, lambda x: x[::-1]), (Sort, np.sort)])
def test_targets_are_the_function_of_inputs(cls, fn):
    batch = next(iter(cls().reader("train", HP)))
    for x, y, after in _rows(batch):
        np.testing.assert_array_equal(y, fn(x))
        assert (after == PAD_ID).all()


def test_addition_is_correct():
    batch = next(iter(Addition().reader("train", HP)))
    base = HP.num_symbols - 1
    for x, y, _ in _rows(batch):
        sep = int(np.where(x == base)[0][0])
        a, b = x[:sep], x[sep + 1:]
        value = lambda digits: sum(int(d) * base ** i for i, d in enumerate(digits))
        assert value(y) == value(a) + value(b)


def test_reader_is_deterministic_and_resumes_exactly():
    full = [b["inputs"].clone() for b in Reverse().reader("train", HP)]
    reader = Reverse().reader("train", HP)
    it = iter(reader)
    for _ in range(3):
        next(it)
    state = reader.state_dict()
    resumed = Reverse().reader("train", HP)
    resumed.load_state_dict(state)
    rest = [b["inputs"] for b in resumed]
    assert len(rest) == len(full) - 3
    for a, b in zip(rest, full[3:]):
        assert torch.equal(a, b)


def test_epochs_and_splits_differ():
    reader = Reverse().reader("train", HP)
    first = next(iter(reader))["inputs"]
    reader.set_epoch(1)
    second = next(iter(reader))["inputs"]
    valid = next(iter(Reverse().reader("valid", HP)))["inputs"]
    assert not torch.equal(first, second) and not torch.equal(first, valid)


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="unknown split"):
        Reverse().reader("dev", HP)
