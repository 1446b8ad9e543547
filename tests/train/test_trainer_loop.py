"""Trainer loop: stopping criteria, accumulation, log cadence, precision, callbacks, notices."""
from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch

from helpers import run_in_fresh_process, ListReader, make_trainer, params_of, tiny_hp
from hotloop.engine import Strategy, StrategyError
from hotloop.problems.algorithmic import Reverse
from hotloop.train import Callback, EarlyStopping, Event, TrainerError
from hotloop.compose.build import build_model
from hotloop.train.checkpoint import load_checkpoint
from hotloop.registry import models, problems

pytestmark = pytest.mark.timeout(120)


def test_max_steps_stops_exactly(out):
    result = make_trainer(out, max_steps=5).fit()
    assert (result.steps, result.stop_reason) == (5, "max_steps")
    assert result.metrics["valid"]["loss"] > 0  # final evaluation ran


def test_max_epochs_counts_reader_batches(out):
    trainer = make_trainer(out, max_steps=0, max_epochs=2)
    result = trainer.fit()
    assert result.stop_reason == "max_epochs"
    assert result.epochs == 2
    assert result.steps == 2 * trainer.steps_per_epoch == 2 * 8  # 64 examples / batch 8


def test_max_time_stops_a_long_run(out):
    result = make_trainer(None, max_steps=10**7, max_time=0.5).fit()
    assert result.stop_reason == "max_time"
    assert 0 < result.steps < 10**7


def test_no_stopping_criterion_is_rejected():
    with pytest.raises(TrainerError, match="no end"):
        make_trainer(None, max_steps=0)


def test_log_rows_every_sync_every_steps_and_one_host_sync_each(out):
    trainer = make_trainer(out, max_steps=9, strategy=Strategy(prefetch=0, sync_every=3))
    trainer.fit()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [3, 6, 9]
    assert trainer.host_syncs == len(train)  # statistics are read once per row, never per step
    for key in ("step", "epoch", "loss", "ppl", "lr", "tokens_per_s", "examples_per_s", "data_fraction"):
        assert key in train[0]
    assert math.isclose(train[0]["ppl"], math.exp(train[0]["loss"]), rel_tol=1e-9)
    valid = [r for r in rows if r["split"] == "valid"]
    assert valid and {"loss", "accuracy", "seq_accuracy"} <= set(valid[-1])


def _fixed_length_batches(n: int, batch: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    hp = tiny_hp(f"batch_size={batch},min_length=6")  # every example has 6 symbols: equal token counts
    reader = Reverse().reader("train", hp)
    return [b for _, b in zip(range(n), reader)]


def test_accumulation_matches_the_big_batch_step():
    big = _fixed_length_batches(4, 16)
    halves = [{k: v[i * 8:(i + 1) * 8] for k, v in b.items()} for b in big for i in range(2)]
    # SGD: Adam would amplify fp32 rounding of near-zero gradients (g / sqrt(v)) into large updates
    hp = tiny_hp("min_length=6,lr_schedule=constant,warmup_steps=0,optimizer=sgd,learning_rate=0.5")
    a = make_trainer(None, hp, max_steps=4, train_reader=ListReader(big), eval_splits=())
    b = make_trainer(None, hp.replace(accum_steps=2, batch_size=8), max_steps=4,
                     train_reader=ListReader(halves), eval_splits=())
    assert all(torch.equal(x, y) for x, y in zip(params_of(a).values(), params_of(b).values()))
    a.fit()
    b.fit()
    pa, pb = params_of(a), params_of(b)
    moved = max((pa[k] - v).abs().max().item() for k, v in params_of(make_trainer(None, hp, max_steps=1)).items())
    assert moved > 1e-3  # training changed the weights
    for key in pa:
        torch.testing.assert_close(pa[key], pb[key], rtol=1e-4, atol=1e-5)


def test_bf16_autocast_trains_on_cpu():
    trainer = make_trainer(None, max_steps=4, strategy=Strategy(prefetch=0, precision="bf16"))
    before = params_of(trainer)
    result = trainer.fit()
    assert math.isfinite(result.metrics["valid"]["loss"])
    assert any(not torch.equal(before[k], v) for k, v in params_of(trainer).items())
    assert all(v.dtype == torch.float32 for v in params_of(trainer).values())  # master weights stay fp32


def test_fp16_on_cpu_is_rejected():
    with pytest.raises(StrategyError, match="fp16 needs CUDA"):
        make_trainer(None, strategy=Strategy(precision="fp16"))


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.steps_seen = 0

    def on_event(self, event, trainer, **info):
        self.events.append(event)
        if event is Event.STEP_END:
            self.steps_seen += 1

    def state_dict(self):
        return {"steps_seen": self.steps_seen}

    def load_state_dict(self, state):
        self.steps_seen = state["steps_seen"]


def test_callbacks_fire_and_their_state_is_checkpointed(out):
    rec = Recorder()
    result = make_trainer(out, max_steps=0, max_epochs=1, eval_every=4, strategy=Strategy(prefetch=0, sync_every=4),
                          callbacks=[rec]).fit()
    ev = rec.events
    assert ev[0] is Event.FIT_START and ev[-1] is Event.FIT_END
    assert ev.count(Event.EPOCH_START) == 1 and ev.count(Event.STEP_END) == 8
    assert ev.count(Event.LOG) == 2 and ev.count(Event.EVAL_END) == 2 and ev.count(Event.CHECKPOINT) == 2
    meta = load_checkpoint(result.last_checkpoint)["meta"]
    assert meta["callbacks"]["Recorder"] == {"steps_seen": 8}
    fresh = Recorder()
    make_trainer(out, max_steps=0, max_epochs=1, callbacks=[fresh]).load_checkpoint(result.last_checkpoint)
    assert fresh.steps_seen == 8


def test_early_stopping_requests_a_stop_and_keeps_state(out):
    stopper = EarlyStopping(monitor="loss", patience=2, min_delta=10.0)  # nothing improves by 10
    result = make_trainer(out, max_steps=100, eval_every=2, callbacks=[stopper]).fit()
    assert result.stop_reason.startswith("stopped: early stopping")
    assert result.steps == 6  # first eval sets the best, the next two do not improve
    assert load_checkpoint(result.last_checkpoint)["meta"]["callbacks"]["EarlyStopping"]["bad_evals"] == 2


class SigintAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_event(self, event, trainer, **info):
        if event is Event.STEP_END and trainer.step == self.step:
            signal.raise_signal(signal.SIGINT)   # to this (main) thread: native pools get no signal


def test_ctrl_c_saves_a_checkpoint_and_raises(out):
    """In a fresh process, as `hotloop train` runs: in the suite's long-lived process a SIGINT sent after
    the OpenVINO decoder test (tests/export/test_seq2seq_graphs.py) ended in a segmentation fault; a
    small OpenVINO script followed by SIGINT does not, so the cause is not pinned down."""
    run_in_fresh_process(_ctrl_c_body, out)


def _ctrl_c_body(out):
    trainer = make_trainer(out, max_steps=10, callbacks=[SigintAt(3)])
    handler_before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert trainer.step == 3
    assert trainer.last_checkpoint is not None and trainer.last_checkpoint.name == "step-00000003.ckpt"
    assert load_checkpoint(trainer.last_checkpoint)["meta"]["step"] == 3
    assert signal.getsignal(signal.SIGINT) is handler_before  # handler restored
    resumed = make_trainer(out, max_steps=10).fit(resume=True)
    assert resumed.steps == 10


def test_data_bound_run_warns_once(out):
    trainer = make_trainer(None, max_steps=16, strategy=Strategy(prefetch=0, sync_every=4), eval_splits=())
    ticks = iter(range(0, 10**9, 3600))  # every next() appears to wait an hour: data-bound
    trainer.feeder.clock = lambda: float(next(ticks))
    trainer.fit()
    warnings = [n for n in trainer.notices if "waiting for data" in n]
    assert len(warnings) == 1 and "num_workers" in warnings[0]


def test_compute_bound_run_does_not_warn(out):
    trainer = make_trainer(None, max_steps=8, strategy=Strategy(prefetch=0, sync_every=4), eval_splits=())
    trainer.feeder.clock = lambda: 0.0  # data never waits
    trainer.fit()
    assert not [n for n in trainer.notices if "waiting for data" in n]


def test_trainer_takes_only_a_strategy():
    with pytest.raises(TrainerError, match="must be a Strategy"):
        make_trainer(None, max_steps=2, strategy="auto")


def test_plan_strategy_tunes_then_applies_the_overrides(monkeypatch):
    from hotloop.compose import plan
    calls = {}

    def fake_auto(model, problem, hp, device, *, planned=None, max_time=None, log=print):
        calls.update(model=model, device=str(device), max_time=max_time)
        log("tuned")
        return Strategy(prefetch=0, sync_every=7, fused_optimizer=False)

    monkeypatch.setattr(plan, "auto_strategy", fake_auto)
    hp = tiny_hp()
    problem = problems.get("algorithmic_reverse")()
    model = build_model(models.get("transformer"), hp, problem.spec(hp))
    request = plan.StrategyRequest.parse("auto", "fused_optimizer=true,sync_every=3", "cpu")
    notes: list[str] = []
    chosen = plan.plan_strategy(request, model=model, problem=problem, hp=hp, device="cpu", max_time=9.0,
                                log=notes.append)
    assert calls == {"model": model, "device": "cpu", "max_time": 9.0} and notes == ["tuned"]
    assert chosen == Strategy(prefetch=0, sync_every=3, fused_optimizer=True)   # the overrides win
    fixed = plan.StrategyRequest.parse("default", "prefetch=0", "cpu")
    assert plan.plan_strategy(fixed, model=model, problem=problem, hp=hp, device="cpu") == Strategy(prefetch=0)
    assert calls["max_time"] == 9.0 and len(notes) == 1                         # "default" never tunes


def test_empty_reader_and_bad_accumulation_are_errors():
    with pytest.raises(TrainerError, match="no batches"):
        make_trainer(None, max_steps=5, train_reader=ListReader([])).fit()
    with pytest.raises(TrainerError, match="accum_steps"):
        make_trainer(None, tiny_hp("accum_steps=0"))
