"""Mixing schedules and the mixing reader: frequencies, determinism, cycling, exact resume."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import ListReader
from hotloop.errors import UserError
from hotloop.problems.mixing import MixingReader, mixing_probabilities, task_of


def _readers(sizes):
    """Task t's reader yields batches whose "inputs" hold (t, epoch-free index): [[t, i]]."""
    return [ListReader([{"inputs": torch.tensor([[t, i]])} for i in range(n)]) for t, n in enumerate(sizes)]


def _ids(batches):
    return [(task_of(b), int(b["inputs"][0, 1])) for b in batches]


def test_probabilities_by_hand():
    sizes = [100, 25, 400]
    assert np.allclose(mixing_probabilities("proportional", sizes), [100 / 525, 25 / 525, 400 / 525])
    assert np.allclose(mixing_probabilities("uniform", sizes), [1 / 3] * 3)
    assert np.allclose(mixing_probabilities("rates", sizes, rates=(1, 1, 2)), [0.25, 0.25, 0.5])
    # temperature 2: p ~ sqrt(size) = 10, 5, 20
    assert np.allclose(mixing_probabilities("temperature", sizes, temperature=2.0), [10 / 35, 5 / 35, 20 / 35])
    assert np.allclose(mixing_probabilities("temperature", sizes, temperature=1.0),
                       mixing_probabilities("proportional", sizes))


@pytest.mark.parametrize("bad", [dict(mode="rates", rates=(1, 2)), dict(mode="rates", rates=(1, -1, 1)),
                                 dict(mode="temperature", temperature=0.0), dict(mode="nope")])
def test_bad_schedules_are_user_errors(bad):
    mode = bad.pop("mode")
    with pytest.raises(UserError):
        mixing_probabilities(mode, [1, 2, 3], **bad)


@pytest.mark.parametrize("mode", ["proportional", "temperature", "rates"])
def test_draw_frequencies_match_the_schedule(mode):
    sizes = [50, 10, 140]
    probs = mixing_probabilities(mode, sizes, rates=(0.2, 0.5, 0.3), temperature=3.0)
    steps = 20000
    reader = MixingReader(_readers(sizes), ["a", "b", "c"], probs, seed=3, epoch_steps=steps)
    counts = np.bincount(reader.schedule(0), minlength=3)
    sigma = np.sqrt(steps * probs * (1 - probs))
    assert np.all(np.abs(counts - steps * probs) < 4 * sigma), (counts, steps * probs)
    # the batches served follow the schedule
    served = [task_of(b) for b in reader]
    assert served == [["a", "b", "c"][t] for t in reader.schedule(0)]


def test_schedule_is_deterministic_by_seed_and_epoch():
    probs = [0.5, 0.5]
    a = MixingReader(_readers([4, 4]), ["a", "b"], probs, seed=11, epoch_steps=64)
    b = MixingReader(_readers([4, 4]), ["a", "b"], probs, seed=11, epoch_steps=64)
    c = MixingReader(_readers([4, 4]), ["a", "b"], probs, seed=12, epoch_steps=64)
    assert np.array_equal(a.schedule(0), b.schedule(0))
    assert not np.array_equal(a.schedule(0), c.schedule(0))
    assert not np.array_equal(a.schedule(0), a.schedule(1))


def test_tasks_cycle_through_their_own_epochs():
    sizes = [3, 2]
    reader = MixingReader(_readers(sizes), ["a", "b"], [0.5, 0.5], seed=5, epoch_steps=11)
    got = _ids(list(reader)) + _ids(list(reader))            # two mixed epochs
    order = list(reader.schedule(0)) + list(reader.schedule(1))
    position = [0, 0]
    expected = []
    for t in order:                                          # brute force: each task cycles 0..n-1
        expected.append((["a", "b"][t], position[t] % sizes[t]))
        position[t] += 1
    assert got == expected
    assert reader.epoch == 2 and reader.index == 0


@pytest.mark.parametrize("stop", [1, 4, 10, 11, 12, 17])
def test_resume_serves_exactly_the_remaining_batches(stop):
    def make():
        return MixingReader(_readers([3, 2, 5]), ["a", "b", "c"], [0.3, 0.3, 0.4], seed=9, epoch_steps=11)

    straight = make()
    full = _ids(list(straight)) + _ids(list(straight))
    first = make()
    taken = []
    it = iter(first)
    for _ in range(stop):
        try:
            taken.append(next(it))
        except StopIteration:                                 # the epoch ended: next epoch
            it = iter(first)
            taken.append(next(it))
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = _ids(list(resumed))
    if resumed.epoch == 1 and len(_ids(taken)) + len(rest) < len(full):
        rest += _ids(list(resumed))
    assert _ids(taken) + rest == full
