"""Sources and stages: order, determinism, per-epoch reshuffle, resume, collate, bucket."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotloop.data import Reader, collate, from_arrays, from_generator, stream_windows
from hotloop.data.stages import bucket_boundaries


def _values(batches, key="x"):
    return [b[key].tolist() for b in batches]


def _assert_resume_exact(make_reader, k):
    """Consume k items, save, rebuild, load: the rest equals the tail of a full epoch."""
    full = list(make_reader())
    reader = make_reader()
    it = iter(reader)
    for _ in range(k):
        next(it)
    state = reader.state_dict()
    it.close()
    resumed = make_reader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - k
    for a, b in zip(rest, full[k:]):
        if isinstance(a, dict):
            assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
        else:
            assert np.array_equal(np.asarray(a), np.asarray(b))
    return full


def test_arrays_in_order_and_epoch_advances():
    reader = from_arrays({"x": np.arange(5), "y": np.arange(5) * 2})
    items = list(reader)
    assert [int(i["x"]) for i in items] == [0, 1, 2, 3, 4] and int(items[3]["y"]) == 6
    assert reader.state_dict() == {"epoch": 1, "position": 0} and len(reader) == 5
    assert [int(t[1]) for t in from_arrays((np.arange(3), np.arange(3) + 10))] == [10, 11, 12]


def test_shuffle_is_seeded_a_permutation_and_reshuffles_per_epoch():
    def make():
        return from_arrays(np.arange(100)).shuffle(16, seed=7)
    first = [int(v) for v in make()]
    assert first == [int(v) for v in make()]            # deterministic
    assert sorted(first) == list(range(100)) and first != list(range(100))
    reader = make()
    reader.set_epoch(1)
    second = [int(v) for v in reader]
    assert sorted(second) == list(range(100)) and second != first
    other_seed = [int(v) for v in from_arrays(np.arange(100)).shuffle(16, seed=8)]
    assert other_seed != first


def test_shuffle_of_a_generator_matches_the_indexed_order():
    by_index = [int(v) for v in from_arrays(np.arange(50)).shuffle(8, seed=3)]
    by_stream = [int(v) for v in from_generator(lambda: iter(range(50))).shuffle(8, seed=3)]
    assert by_index == by_stream


def test_generator_factory_gets_the_epoch():
    reader = from_generator(lambda epoch: iter(range(epoch, epoch + 3)))
    assert list(reader) == [0, 1, 2] and list(reader) == [1, 2, 3]
    reader.set_epoch(5)
    assert list(reader) == [5, 6, 7]

    def with_default(n=2):
        return iter(range(n))
    assert list(from_generator(with_default)) == [0, 1]  # a defaulted parameter is not the epoch


def test_batch_pads_with_zero_to_int64_dict():
    items = [{"inputs": np.array([3, 4, 5]), "targets": np.array([6])},
             {"inputs": np.array([7]), "targets": np.array([8, 9])}]
    batch = collate(items)
    assert batch["inputs"].dtype == torch.int64
    assert batch["inputs"].tolist() == [[3, 4, 5], [7, 0, 0]]
    assert batch["targets"].tolist() == [[6, 0], [8, 9]]
    batches = list(from_arrays(np.arange(10)).batch(4))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(list(from_arrays(np.arange(10)).batch(4, drop_last=True))) == 2


@pytest.mark.parametrize("k", [0, 1, 5, 12])
def test_resume_mid_epoch_shuffle_map_batch(k):
    def make():
        data = {"x": np.arange(50), "y": np.arange(50) * 3}
        return (from_arrays(data).shuffle(10, seed=1)
                .map(lambda d: {"x": d["x"] + 1, "y": d["y"]}).batch(4))
    full = _assert_resume_exact(make, k)
    assert len(full) == 13


def test_resume_generator_and_epoch_state():
    def make():
        return from_generator(lambda epoch: iter(range(epoch * 100, epoch * 100 + 30))).shuffle(7, seed=2).batch(3)
    _assert_resume_exact(make, 4)
    reader = make()
    reader.load_state_dict({"epoch": 2, "position": 9})
    assert [b.tolist() for b in reader] == [b.tolist() for b in list(_epoch(make(), 2))[9:]]


def _epoch(reader: Reader, epoch: int):
    reader.set_epoch(epoch)
    return reader


def test_bad_state_is_a_clear_error():
    with pytest.raises(ValueError, match="bad reader state"):
        from_arrays(np.arange(3)).load_state_dict({"index": 1})


def test_take_skip_repeat():
    base = from_arrays(np.arange(6))
    assert [int(v) for v in base.take(4)] == [0, 1, 2, 3]
    assert [int(v) for v in from_arrays(np.arange(6)).skip(4)] == [4, 5]
    rep = from_arrays(np.arange(3)).shuffle(3, seed=0).repeat(2)
    values = [int(v) for v in rep]
    assert len(values) == 6 and sorted(values[:3]) == sorted(values[3:]) == [0, 1, 2]
    assert len(rep) == 6
    _assert_resume_exact(lambda: from_arrays(np.arange(5)).shuffle(4, seed=1).repeat(3).skip(1).take(11), 7)
    endless = iter(from_generator(lambda: iter(range(2))).repeat())
    assert [next(endless) for _ in range(5)] == [0, 1, 0, 1, 0]


def test_bucket_token_budget_and_all_items_kept():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=300)
    seqs = [np.full(n, i + 1) for i, n in enumerate(lengths)]

    def make():
        return from_arrays({"inputs": np.array(seqs, dtype=object)}).shuffle(64, seed=4).bucket(
            max_tokens=200, max_length=64)
    batches = list(make())
    seen = []
    for b in batches:
        rows, width = b["inputs"].shape
        assert rows * width <= 200                       # padded tokens within the budget
        seen += [int(r[0]) for r in b["inputs"]]
    assert sorted(seen) == list(range(1, 301))           # every example once
    widths = [b["inputs"].shape[1] for b in batches]
    assert max(widths) <= 64 and len(set(widths)) > 3    # several buckets used
    _assert_resume_exact(make, 5)


def test_bucket_drops_too_long_and_boundaries():
    assert bucket_boundaries(20, 8, 1.1)[:4] == [8, 9, 10, 11] and bucket_boundaries(20)[-1] == 20
    data = {"inputs": np.array([np.ones(3), np.ones(30)], dtype=object)}
    batches = list(from_arrays(data).bucket(max_tokens=100, max_length=10))
    assert len(batches) == 1 and batches[0]["inputs"].shape == (1, 3)


def test_stream_windows_shape_and_resume():
    tokens = np.arange(1000, dtype=np.int32)
    reader = stream_windows(tokens, batch_size=4, num_steps=10)
    assert len(reader) == (250 - 1) // 10
    first = next(iter(reader))
    assert first["inputs"][1, :3].tolist() == [250, 251, 252] and first["targets"][1, :3].tolist() == [251, 252, 253]
    _assert_resume_exact(lambda: stream_windows(tokens, 4, 10), 11)
    with pytest.raises(ValueError, match="too few"):
        stream_windows(tokens[:10], 4, 10)


@pytest.mark.timeout(10)
def test_endless_repeat_of_nothing_ends():
    assert list(from_generator(lambda: iter(())).repeat()) == []


def test_bucket_packs_the_epoch_leftovers_into_few_full_batches():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 60, size=500)
    seqs = [np.full(n, i + 1) for i, n in enumerate(lengths)]
    data = {"inputs": np.array(seqs, dtype=object)}
    reader = from_arrays(data).shuffle(500, seed=2).bucket(max_tokens=400, max_length=64)
    first, second = list(reader), list(reader)              # two epochs
    for batches in (first, second):
        assert sorted(int(r[0]) for b in batches for r in b["inputs"]) == list(range(1, 501))
        assert all(b["inputs"].shape[0] * b["inputs"].shape[1] <= 400 for b in batches)
    # without packing every non-empty partial bucket would end the epoch as its own batch
    bounds = bucket_boundaries(64)
    sizes = [max(1, 400 // b) for b in bounds]
    per_bucket = np.bincount(np.searchsorted(bounds, lengths), minlength=len(bounds))
    partial = int(sum(1 for count, size in zip(per_bucket, sizes) if count % size))
    full = int(sum(count // size for count, size in zip(per_bucket, sizes)))
    leftovers = first[full:]
    assert len(first) < full + partial and len(leftovers) >= 1
    fill = [b["inputs"].shape[0] * b["inputs"].shape[1] / 400 for b in leftovers]
    assert sorted(fill)[len(fill) // 2] > 0.5               # most packed batches are at least half full
    widths = [b["inputs"].shape[1] for b in leftovers]
    assert len(widths) >= 3 and widths != sorted(widths)    # not in length order
    # an unshuffled upstream leaves the same items over every epoch: only their batches' order changes
    plain = from_arrays(data).bucket(max_tokens=400, max_length=64)
    epoch0, epoch1 = ([tuple(int(r[0]) for r in b["inputs"]) for b in list(plain)[full:]] for _ in range(2))
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    _assert_resume_exact(lambda: from_arrays(data).shuffle(500, seed=2).bucket(max_tokens=400, max_length=64),
                         len(first) - 2)


def test_select_serves_the_given_indices_indexable_and_resumable():
    reader = from_arrays(np.arange(10) * 10).select([7, 2, 5])
    assert reader.indexable and len(reader) == 3
    assert [int(x) for x in reader] == [70, 20, 50]
    _assert_resume_exact(lambda: from_arrays(np.arange(50)).select(np.arange(0, 50, 3)).shuffle(8, seed=3), 6)
    with pytest.raises(TypeError, match="indexable"):
        from_generator(lambda: iter(range(3))).select([0])
