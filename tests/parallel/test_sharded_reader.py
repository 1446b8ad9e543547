"""Readers that shard: each rank reads and collates only its rows, the global batches stay today's.

"Today's" is the fallback of :class:`ShardedReader`: every rank makes the whole batch and cuts
its rows (``shard_rows``). No processes: the ranks are simulated by ``rank`` / ``world_size``.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from hotloop.data import from_arrays, from_generator, stream_windows
from hotloop.parallel import ShardedReader, shard_rows


class CountingColumn:
    """An array column that counts its row reads (``__getitem__``) per index."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.reads = values, Counter()

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> Any:
        self.reads[int(index)] += 1
        return self.values[index]


def arrays(n: int = 30) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"inputs": rng.standard_normal((n, 3)).astype(np.float32), "ids": np.arange(n)}


def map_style(columns: dict[str, Any], batch: int = 8, drop_last: bool = False) -> Any:
    return from_arrays(columns).shuffle(len(columns["ids"]), seed=3).batch(batch, drop_last=drop_last)


def today(reader: Any, rank: int, world: int) -> list[dict[str, torch.Tensor]]:
    """The rows every rank used to cut out of whole batches."""
    parts = (shard_rows(batch, rank, world) for batch in reader)
    return [p for p in parts if p is not None]


def assert_same_batches(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("world", [2, 3, 4])
def test_map_style_ranks_read_only_their_rows_and_batches_match_today(world: int) -> None:
    n = 30   # batches of 8, 8, 8, 6: uneven for 3 and 4 ranks
    reads = Counter()
    for rank in range(world):
        columns = {k: CountingColumn(v) for k, v in arrays(n).items()}
        sharded = ShardedReader(map_style(columns), rank, world)
        assert sharded.native
        got = list(sharded)
        assert_same_batches(got, today(map_style(arrays(n)), rank, world))
        mine = {int(i) for batch in got for i in batch["ids"]}
        assert set(columns["ids"].reads) == mine               # only this rank's rows were read...
        assert all(c == 1 for c in columns["ids"].reads.values())   # ...each once
        reads.update(columns["ids"].reads)
    per_batch = [8 // world * world] * 3 + [6 // world * world]
    assert sum(reads.values()) == sum(per_batch)               # together: each global batch's rows once


def test_a_stream_is_cut_by_stride_and_matches_today() -> None:
    def items(epoch: int) -> Any:
        for i in range(21):
            yield {"x": np.array([i, epoch]), "ids": np.int64(i)}
    for rank in range(2):
        sharded = ShardedReader(from_generator(items).batch(5), rank, 2)
        assert sharded.native
        assert_same_batches(list(sharded), today(from_generator(items).batch(5), rank, 2))


def test_ragged_items_match_today_up_to_padding() -> None:
    rng = np.random.default_rng(1)
    sentences = [rng.integers(2, 9, size=int(rng.integers(1, 12))) for _ in range(40)]
    source = lambda: from_arrays({"inputs": sentences, "targets": sentences})  # noqa: E731
    for rank in range(2):
        sharded = ShardedReader(source().bucket(24, max_length=12), rank, 2)
        assert sharded.native
        got = list(sharded)
        expected = today(source().bucket(24, max_length=12), rank, 2)
        assert len(got) == len(expected) > 0
        for a, b in zip(got, expected):
            width = a["inputs"].shape[1]
            assert width <= b["inputs"].shape[1] and torch.equal(a["inputs"], b["inputs"][:, :width])
            assert not b["inputs"][:, width:].any()              # what today's had more is padding


def test_lm_windows_keep_each_ranks_streams_and_read_only_its_rows() -> None:
    tokens = np.arange(6 * 41, dtype=np.int32)
    for rank in range(3):
        sharded = ShardedReader(stream_windows(tokens, 6, 5), rank, 3)
        assert sharded.native and sharded.reader._data.shape[0] == 2        # its 2 of the 6 streams
        assert_same_batches(list(sharded), today(stream_windows(tokens, 6, 5), rank, 3))


def test_stages_over_batches_and_rowwise_maps_shard_their_upstream() -> None:
    double = lambda b: {k: v * 2 for k, v in b.items()}   # noqa: E731 - row by row
    for rank in range(2):
        chain = lambda: map_style(arrays()).map(double, rowwise=True).skip(1).take(2)  # noqa: E731
        sharded = ShardedReader(chain(), rank, 2)
        assert sharded.native
        assert_same_batches(list(sharded), today(chain(), rank, 2))
    assert not ShardedReader(map_style(arrays()).map(double), 0, 2).native   # not declared rowwise


def test_position_is_global_and_resumes_under_another_world_size() -> None:
    two = ShardedReader(map_style(arrays()), 1, 2)
    seen = iter(two)
    next(seen), next(seen)
    state = two.state_dict()
    plain = map_style(arrays())
    plain_it = iter(plain)
    next(plain_it), next(plain_it)
    assert state == plain.state_dict()                           # the same global position
    for world in (1, 3):
        again = ShardedReader(map_style(arrays()), 0, world)
        again.load_state_dict(state)
        reference = map_style(arrays())
        reference.load_state_dict(state)
        assert_same_batches(list(again), today(reference, 0, world))


def test_batches_smaller_than_the_world_are_skipped_by_every_rank() -> None:
    counts = [len(list(ShardedReader(map_style(arrays(3), batch=3), r, 4))) for r in range(4)]
    assert counts == [0, 0, 0, 0]
    assert len(ShardedReader(map_style(arrays(3), batch=3), 0, 4)) == 1   # the position still counts it
