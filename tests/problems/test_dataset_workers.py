"""``DataProblem.reader(workers=N)`` reads a map-style dataset in worker processes (threads when the
dataset does not pickle), in the same order as without workers."""
from __future__ import annotations

import os
import threading

import pytest

from data_forms import BATCH, WhereRead
from hotloop.hparams import HParams
from hotloop.problems.datasets import problem_from_data

pytestmark = pytest.mark.timeout(300)

HP = HParams(batch_size=BATCH, seed=3)


def _read(dataset, workers):
    reader = problem_from_data(dataset).reader("train", HP, workers=workers)
    try:
        return list(reader), getattr(reader, "notices", [])
    finally:
        reader.close()


def test_workers_read_the_dataset_in_other_processes_in_the_same_order():
    alone, _ = _read(WhereRead(), 0)
    pooled, notices = _read(WhereRead(), 2)
    assert [b["index"].tolist() for b in pooled] == [b["index"].tolist() for b in alone]
    pids = {p for b in pooled for p in b["pid"].tolist()}
    assert os.getpid() not in pids and len(pids) == 2 and not notices


def test_a_dataset_that_does_not_pickle_is_read_in_threads():
    dataset = WhereRead()
    dataset.transform = lambda x: x          # a lambda: no worker process can receive it
    batches, notices = _read(dataset, 2)
    threads = {t for b in batches for t in b["thread"].tolist()}
    assert threading.get_ident() not in threads and len(notices) == 1 and "2 threads" in notices[0]


def test_a_data_parallel_rank_fetches_only_its_own_rows():
    whole = [b["index"].tolist() for b in problem_from_data(WhereRead()).reader("train", HP)]
    dataset = WhereRead()
    mine = [b["index"].tolist() for b in problem_from_data(dataset).reader("train", HP).shard(1, 2)]
    assert mine == [rows[len(rows) // 2:] for rows in whole]
    assert dataset.reads == sum(len(rows) for rows in mine)        # the other rank's items are not read
