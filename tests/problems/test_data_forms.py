"""Every data form trains and resumes: exactly (same batches, bitwise-equal parameters, the consumed
data not read again) where the form is resumable, by replay (one notice at start) otherwise."""
from __future__ import annotations

import pytest
import torch

from data_forms import BATCH, SIZE, Probe, make, reads
from helpers import StopAt
from hotloop.engine import Strategy
from hotloop.hparams import HParams
from hotloop.problems.datasets import problem_from_data
from hotloop.train import Trainer

pytestmark = pytest.mark.timeout(300)

HP = HParams(batch_size=BATCH, learning_rate=0.05, optimizer="adam", seed=7)
TOTAL, STOP = 9, 4                     # 6 batches an epoch: stop inside epoch 0, finish inside epoch 1
EXACT = ("dataset", "list", "hf", "loader", "stateful")
REPLAY = ("iterable", "loader_iterable", "function")


def _trainer(data, out, prefetch, callbacks=()):
    return Trainer(problem_from_data(data), Probe(), HP, output_dir=out, max_steps=TOTAL, loggers=[],
                   strategy=Strategy(prefetch=prefetch), callbacks=list(callbacks))


def _straight_and_resumed(tmp_path, form, prefetch):
    straight = _trainer(make(form), tmp_path / "straight", prefetch)
    straight.fit()
    first = _trainer(make(form), tmp_path / "resumed", prefetch, [StopAt(STOP)])
    assert first.fit().steps == STOP
    data = make(form)
    second = _trainer(data, tmp_path / "resumed", prefetch)
    assert second.fit(resume=True).steps == TOTAL
    return straight, first, second, data


def _same_run(straight, first, second):
    assert straight.model.seen == first.model.seen + second.model.seen      # the same batches
    assert len(straight.model.seen) == TOTAL
    assert sorted(i for b in straight.model.seen[:6] for i in b) == list(range(SIZE))   # an epoch is a permutation
    a, b = straight.model.state_dict(), second.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "parameters differ after resume"


@pytest.mark.parametrize("form", EXACT + REPLAY)
def test_each_form_trains_and_resumes(tmp_path, form):
    straight, first, second, data = _straight_and_resumed(tmp_path, form, prefetch=0)
    _same_run(straight, first, second)
    notes = [n for n in second.notices if "not resumable" in n]
    assert len(notes) == (form in REPLAY)
    if form in ("dataset", "loader", "stateful", "iterable", "loader_iterable"):
        # resumed at batch 4 of 6: exact forms read the 2 batches left and 3 of epoch 1;
        # replay reads epoch 0 again from its start
        left = (6 - STOP + TOTAL - 6) * BATCH
        assert reads(data) == (left if form in EXACT else left + STOP * BATCH)


@pytest.mark.parametrize("form", ["hf", "loader", "stateful"])
def test_resume_is_exact_with_a_prefetch_thread(tmp_path, form):
    _same_run(*_straight_and_resumed(tmp_path, form, prefetch=2)[:3])


def test_a_loader_with_worker_processes_resumes_exactly(tmp_path):
    _same_run(*_straight_and_resumed(tmp_path, "loader_workers", prefetch=2)[:3])


def test_loader_keeps_its_sampler_order_and_epochs_reshuffle():
    problem = problem_from_data(make("loader"))
    reader = problem.reader("train", HP)
    first, second = [[b["index"].tolist() for b in reader] for _ in range(2)]
    assert len(first) == SIZE // BATCH and first != second
    assert sorted(sum(first, [])) == list(range(SIZE))
    sequential = problem_from_data(torch.utils.data.DataLoader(make("dataset"), batch_size=5))
    assert [b["index"].tolist() for b in sequential.reader("train", HP)][-1] == [20, 21, 22, 23]


def test_trainer_takes_a_dataloader_without_problem_from_data():
    trainer = Trainer(make("loader"), Probe(), HP, max_steps=3, loggers=[])
    assert trainer.fit().steps == 3 and trainer.steps_per_epoch == SIZE // BATCH
    assert trainer.model.dtypes["inputs"] == torch.uint8


def test_a_dataloader_as_train_reader_is_wrapped_and_resumes(tmp_path):
    def run(out, **kwargs):
        trainer = Trainer(problem_from_data(make("dataset")), Probe(), HP, output_dir=out, max_steps=TOTAL,
                          loggers=[], train_reader=make("stateful"), **kwargs)
        return trainer
    straight = run(tmp_path / "a")
    straight.fit()
    first = run(tmp_path / "b", callbacks=[StopAt(STOP)])
    first.fit()
    second = run(tmp_path / "b")
    second.fit(resume=True)
    _same_run(straight, first, second)


@pytest.mark.parametrize("batch_size", [None, 5])
def test_a_loader_resumes_from_its_position_with_or_without_batching(batch_size):
    loader = torch.utils.data.DataLoader(make("dataset"), batch_size=batch_size, shuffle=True)
    reader = problem_from_data(loader).reader("train", HP)
    reader.set_epoch(1)
    full = [b["index"].tolist() for b in reader]
    reader.load_state_dict({"epoch": 1, "position": 3})
    assert [b["index"].tolist() for b in reader] == full[3:] and len(full) == len(loader)
