"""Evaluation with eval_step / loss_fn / metric objects; --monitor picks the best; early stopping."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torchmetrics.classification import MulticlassF1Score
from torchmetrics.functional.classification import multiclass_f1_score

from helpers import StopAt, make_trainer, tiny_hp
from hotloop.engine.step_parts import default_loss_fn
from hotloop.errors import UserError
from hotloop.train import Callback, EarlyStopping, Event
from hotloop.train.checkpoint import load_checkpoint
from hotloop.train.metrics import MetricSpec
from hotloop.train.monitor import MonitorError

VOCAB = 12   # algorithmic_reverse's target vocabulary (id 0: padding)


def token_outputs(model, batch):
    """Per-token predicted ids and targets, flattened: [B*T] each."""
    logits, _ = model(batch)                                     # [B, T, V]
    return {"preds": logits.argmax(-1).flatten(), "target": batch["targets"].flatten(),
            "scores": logits.reshape(-1, logits.shape[-1])}     # [B*T, V]


def f1() -> MulticlassF1Score:
    return MulticlassF1Score(num_classes=VOCAB, average="macro", ignore_index=0)


class EvalRows(Callback):
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, float]] = {}

    def on_event(self, event, trainer, **info):
        if event is Event.EVAL_END:
            self.rows[trainer.step] = dict(info["metrics"])


def test_a_torchmetrics_f1_equals_the_same_metric_over_all_batches(out):
    trainer = make_trainer(out, eval_step=token_outputs, metrics={"f1": f1()}, loggers=[])
    got = trainer.evaluate("valid")
    reader, start = trainer._eval_reader("valid")
    reader.load_state_dict(start)
    with torch.no_grad():
        outs = [token_outputs(trainer.model.eval(), batch) for batch in reader]
    expected = multiclass_f1_score(torch.cat([o["preds"] for o in outs]), torch.cat([o["target"] for o in outs]),
                                   num_classes=VOCAB, average="macro", ignore_index=0)
    assert set(got) == {"f1"} and got["f1"] == pytest.approx(float(expected), abs=1e-7)
    assert trainer.evaluate("valid")["f1"] == got["f1"]        # reset between evaluations


def test_f1_picks_the_best_checkpoint_and_stops_early(out):
    rows = EvalRows()
    stopper = EarlyStopping("f1", patience=2, mode="max", min_delta=1.0)   # F1 cannot improve by 1
    trainer = make_trainer(out, tiny_hp("learning_rate=0.01"), max_steps=100, eval_every=2,
                           eval_step=token_outputs, metrics={"f1": f1()}, monitor="f1", mode="max",
                           callbacks=[stopper, rows], keep_last=1)
    result = trainer.fit()
    assert result.stop_reason.startswith("stopped: early stopping: valid f1")
    assert result.steps == 6 and sorted(rows.rows) == [2, 4, 6]
    best_step = max(rows.rows, key=lambda s: rows.rows[s]["f1"])
    record = json.loads((out / "checkpoints" / "best.json").read_text())
    assert (record["step"], record["monitor"], record["mode"]) == (best_step, "f1", "max")
    assert record["value"] == rows.rows[best_step]["f1"]
    assert result.best_checkpoint == str(out / "checkpoints" / f"step-{best_step:08d}.ckpt")
    assert load_checkpoint(result.best_checkpoint)["meta"]["step"] == best_step


def test_max_mode_keeps_the_highest_not_the_lowest(out):
    rows = EvalRows()
    trainer = make_trainer(out, tiny_hp("learning_rate=0.01"), max_steps=8, eval_every=2, monitor="accuracy",
                           mode="max", callbacks=[rows], keep_last=1)
    trainer.fit()
    accuracy = {s: r["accuracy"] for s, r in rows.rows.items()}
    assert len(set(accuracy.values())) > 1, accuracy     # else the test could not tell min from max
    assert trainer.checkpoints.best_step == max(accuracy, key=lambda s: (accuracy[s], -s))


@pytest.mark.parametrize("kwargs,who", [
    (dict(monitor="f1_score"), "--monitor"),
    (dict(callbacks=[EarlyStopping("acuracy")]), "EarlyStopping monitor")])
def test_an_unknown_monitor_fails_at_start_naming_the_metrics(out, kwargs, who):
    trainer = make_trainer(out, eval_step=token_outputs, metrics={"f1": f1()}, max_steps=4, eval_every=2,
                           loggers=[], **kwargs)
    with pytest.raises(MonitorError) as info:
        trainer.fit()
    message = str(info.value)
    assert message.startswith(who) and "has: f1" in message and "\n" not in message
    assert trainer.step == 0                 # before any training step


def test_an_unknown_default_metric_lists_the_model_metrics(out):
    with pytest.raises(MonitorError, match="has: accuracy, examples, loss, ppl, seq_accuracy, tokens"):
        make_trainer(out, monitor="bleu", loggers=[]).fit()


def test_the_trainer_loss_fn_is_used_for_evaluation(out):
    def doubled(model, batch, state):
        result = default_loss_fn(model, batch, state)
        return dataclasses.replace(result, stats={**result.stats, "nll_sum": 2 * result.stats["nll_sum"]})
    plain = make_trainer(None, loggers=[]).evaluate("valid")
    custom = make_trainer(None, loss_fn=doubled, loggers=[]).evaluate("valid")
    assert custom["loss"] == pytest.approx(2 * plain["loss"])
    assert "accuracy" not in custom          # the user's loss function, not the model's with_accuracy


def test_an_eval_step_loss_and_plain_metric_objects(out):
    class Count:                              # a plain object: update / compute / reset
        def __init__(self) -> None:
            self.n = 0

        def update(self, target) -> None:
            self.n += int((target > 0).sum())

        def compute(self):
            return torch.tensor([self.n, 2 * self.n])

        def reset(self) -> None:
            self.n = 0

    def step(model, batch):
        outputs = token_outputs(model, batch)
        outputs["loss"] = torch.nn.functional.cross_entropy(outputs["scores"], outputs["target"], ignore_index=0)
        outputs["weight"] = (outputs["target"] > 0).sum()
        return outputs
    trainer = make_trainer(None, eval_step=step, loggers=[],
                           metrics={"count": MetricSpec(Count(), inputs=("target",))})
    got = trainer.evaluate("valid")
    plain = make_trainer(None, loggers=[]).evaluate("valid")
    assert got["loss"] == pytest.approx(plain["loss"], rel=1e-6)   # the token-weighted mean
    assert (got["count/0"], got["count/1"], got["examples"]) == (plain["tokens"], 2 * plain["tokens"],
                                                                   plain["tokens"])


def test_bad_metrics_are_user_errors():
    with pytest.raises(UserError, match="has no update, compute"):
        make_trainer(None, metrics={"x": object()}, loggers=[])
    trainer = make_trainer(None, metrics={"x": MetricSpec(f1(), inputs=("probs", "target"))}, loggers=[])
    with pytest.raises(UserError, match="'probs' is neither an evaluation output nor a batch key; there are: "
                                        "inputs, logits, loss, targets"):
        trainer.evaluate("valid")


def test_resume_keeps_the_best_value_and_the_patience_count(out):
    # patience 3: evaluations at 2 (best), 4, 6 (no improvement by 10); stop at 6, resume: 8 stops
    def run(max_steps, *extra):
        stopper = EarlyStopping("loss", patience=3, min_delta=10.0)
        trainer = make_trainer(out, max_steps=max_steps, eval_every=2, monitor="loss", callbacks=[stopper, *extra],
                               loggers=[])
        return trainer, stopper
    first, stopper = run(100, StopAt(6))
    result = first.fit()
    assert result.steps == 6 and stopper.bad_evals == 2
    best_step = first.checkpoints.best_step
    again, resumed = run(100)
    result = again.fit(resume=True)
    assert result.steps == 8 and result.stop_reason.startswith("stopped: early stopping")
    assert resumed.best == stopper.best and again.checkpoints.best_step in (best_step, 8)


def test_a_best_chosen_by_another_monitor_is_not_compared_with(out):
    make_trainer(out, max_steps=2, eval_every=2, loggers=[]).fit()
    assert make_trainer(out, max_steps=4, loggers=[]).checkpoints.best_step == 2       # the same monitor: kept
    other = make_trainer(out, max_steps=4, monitor="accuracy", mode="max", loggers=[])
    assert other.checkpoints.best_step is None
    assert any("chosen by loss (min)" in note and "monitors accuracy (max)" in note for note in other.notices)
