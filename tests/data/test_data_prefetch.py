"""Async prefetch: same batches, consumed-position state, error propagation, shutdown, speed test."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch

from hotloop.data import ReaderError, from_arrays, from_generator, prefetch, speed_test
from hotloop.data.prefetch import Prefetcher, SyncFeeder
from hotloop.hparams import HParams
from hotloop.problems.algorithmic import Copy, AlgorithmicHParams


def _reader():
    return from_arrays({"x": np.arange(40)}).shuffle(8, seed=5).batch(3)


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "hotloop-prefetch" and t.is_alive()]


@pytest.mark.timeout(20)
def test_prefetch_yields_the_same_batches_in_order():
    expected = [b["x"].tolist() for b in _reader()]
    fed = prefetch(_reader(), capacity=2, device="cpu")
    got = [b["x"].tolist() for b in fed]
    assert got == expected
    assert fed.stats.batches == len(expected) and fed.stats.total_wait_s >= 0 and fed.stats.capacity == 2
    assert fed.state_dict() == {"epoch": 1, "position": 0}
    assert not _prefetch_threads()


@pytest.mark.timeout(20)
def test_state_reflects_consumed_not_produced_and_break_resumes_exactly():
    reader = _reader()
    expected = [b["x"].tolist() for b in _reader()]
    fed = prefetch(reader, capacity=4)
    it = iter(fed)
    got = [next(it)["x"].tolist() for _ in range(3)]
    deadline = time.monotonic() + 5
    while fed.stats.qsize < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fed.stats.qsize == 4                                  # the producer ran ahead ...
    assert reader.state_dict()["position"] >= 7                 # 3 consumed + 4 queued (+1 waiting)
    assert fed.state_dict() == {"epoch": 0, "position": 3}       # ... but the state is what we consumed
    saved = fed.state_dict()
    it.close()                                                   # break
    assert reader.state_dict() == saved and not _prefetch_threads()
    rest = [b["x"].tolist() for b in fed]                        # continue the same epoch
    assert got + rest == expected
    fresh = prefetch(_reader(), capacity=2)
    fresh.load_state_dict(saved)
    assert [b["x"].tolist() for b in fresh] == expected[3:]


@pytest.mark.timeout(20)
def test_prefetch_wraps_any_reader_protocol_exactly():
    hp = AlgorithmicHParams(batch_size=4, train_examples=40)
    full = [b["inputs"] for b in Copy().reader("train", hp)]
    reader = Copy().reader("train", hp)
    fed = prefetch(reader, capacity=3)
    it = iter(fed)
    for _ in range(4):
        next(it)
    state = fed.state_dict()
    it.close()
    resumed = Copy().reader("train", hp)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 4 and all(torch.equal(a["inputs"], b) for a, b in zip(rest, full[4:]))


def _exploding_generator():
    yield {"x": np.zeros(2)}
    raise KeyError("generator broke at item 1")


@pytest.mark.timeout(10)
def test_generator_exception_reraised_with_original_traceback():
    fed = prefetch(from_generator(_exploding_generator).batch(1), capacity=2)
    with pytest.raises(ReaderError) as info:
        list(fed)
    assert "generator broke at item 1" in str(info.value) and "_exploding_generator" in str(info.value)
    assert not _prefetch_threads()


def _bad_map(item):
    if int(item) == 5:
        raise ZeroDivisionError("cannot map item 5")
    return item


@pytest.mark.timeout(10)
def test_map_exception_in_process_reraised():
    fed = from_arrays(np.arange(10)).map(_bad_map).prefetch(2)
    with pytest.raises(ReaderError, match=r"(?s)cannot map item 5.*_bad_map"):
        for _ in fed:
            pass
    assert not _prefetch_threads()


@pytest.mark.timeout(10)
def test_exception_in_the_step_stops_the_producer():
    fed = prefetch(from_arrays(np.arange(1000)).batch(2), capacity=2)
    with pytest.raises(RuntimeError, match="step failed"):
        for index, _ in enumerate(fed):
            if index == 3:
                raise RuntimeError("step failed")
    assert not _prefetch_threads()
    assert fed.state_dict() == {"epoch": 0, "position": 4}


def test_capacity_zero_is_synchronous():
    fed = prefetch(_reader(), capacity=0, device="cpu")
    assert isinstance(fed, SyncFeeder)
    assert [b["x"].tolist() for b in fed] == [b["x"].tolist() for b in _reader()]
    assert isinstance(prefetch(_reader()), Prefetcher)


def test_speed_test_serves_prepared_batches_without_consuming(caplog):
    reader = _reader()
    reader.load_state_dict({"epoch": 0, "position": 2})
    with caplog.at_level(logging.WARNING, logger="hotloop.data"):
        fed = speed_test(reader, n_prepared=3)
    assert "SPEED-TEST" in caplog.text
    batches = list(fed)
    assert len(batches) == len(reader) == 14
    assert batches[3] is batches[0] and batches[4] is batches[1]
    assert reader.state_dict() == {"epoch": 0, "position": 2}  # not consumed
    expected = [b["x"].tolist() for b in _reader()][2:5]
    assert [b["x"].tolist() for b in batches[:3]] == expected
    assert len(list(speed_test(_reader(), n_prepared=2))) == 14


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_double_buffer_matches_cpu():
    expected = [b["x"] for b in _reader()]
    got = [b["x"] for b in prefetch(_reader(), capacity=2, device="cuda")]
    assert all(g.is_cuda and torch.equal(g.cpu(), e) for g, e in zip(got, expected))
