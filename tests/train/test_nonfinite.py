"""Non-finite loss policy: stop names the step; skip discards exactly that update (bitwise, CPU fp32)."""
from __future__ import annotations

import itertools

import pytest
import torch

from helpers import ListReader, make_trainer, params_of, tiny_hp
from hotloop.engine import Strategy
from hotloop.registry import problems
from hotloop.train import Callback, Event
from hotloop.train.nonfinite import NonFiniteLossError

pytestmark = pytest.mark.timeout(300)

HP = "dropout=0.0,lr_schedule=constant,warmup_steps=0"


def _batches(n: int) -> list[dict[str, torch.Tensor]]:
    hp = tiny_hp(HP)
    reader = problems.get("algorithmic_reverse")().reader("train", hp, shuffle=False)
    return [dict(b) for b in itertools.islice(iter(reader), n)]


def _nan_on(poisoned: dict[str, torch.Tensor]):
    """A loss function whose loss is NaN on the batch equal to ``poisoned``."""
    def loss_fn(model, batch, state):
        out = model.loss(batch, state)
        if batch["inputs"].shape == poisoned["inputs"].shape and torch.equal(batch["inputs"], poisoned["inputs"]):
            out.loss = out.loss * float("nan")
        return out
    return loss_fn


class Rows(Callback):
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_event(self, event, trainer, **info):
        if event is Event.LOG:
            self.rows.append(info["row"])


def test_stop_names_the_step_and_the_window(tmp_path):
    batches = _batches(8)
    trainer = make_trainer(tmp_path / "r", hp=tiny_hp(HP), max_steps=8, train_reader=ListReader(batches),
                           loss_fn=_nan_on(batches[3]), strategy=Strategy(prefetch=0, sync_every=3))
    with pytest.raises(NonFiniteLossError) as info:
        trainer.fit()
    message = str(info.value)
    assert "at step 4" in message and "steps 4-6" in message and "--on-nonfinite skip" in message
    assert trainer.step == 6  # detected at the first read after step 4, not per step


def test_skip_equals_training_without_that_batch(tmp_path):
    batches = _batches(6)
    rows = Rows()
    skipped = make_trainer(tmp_path / "a", hp=tiny_hp(HP), max_steps=6, train_reader=ListReader(batches),
                           loss_fn=_nan_on(batches[2]), on_nonfinite="skip", callbacks=[rows],
                           strategy=Strategy(prefetch=0, sync_every=2))
    result = skipped.fit()
    assert result.nonfinite_steps == 1
    assert [r["nonfinite_steps"] for r in rows.rows] == [0, 1, 0]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows.rows)
    without = batches[:2] + batches[3:]
    reference = make_trainer(tmp_path / "b", hp=tiny_hp(HP), max_steps=5, train_reader=ListReader(without),
                             strategy=Strategy(prefetch=0, sync_every=2))
    reference.fit()
    a, b = params_of(skipped), params_of(reference)
    assert all(torch.isfinite(v).all() for v in a.values())
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    sa, sb = skipped.optimizer.state_dict()["state"], reference.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_skip_policy_changes_nothing_when_finite(tmp_path):
    hp = tiny_hp("dropout=0.1")
    plain = make_trainer(tmp_path / "a", hp=hp, max_steps=5)
    plain.fit()
    guarded = make_trainer(tmp_path / "b", hp=hp, max_steps=5, on_nonfinite="skip")
    assert guarded.fit().nonfinite_steps == 0
    a, b = params_of(plain), params_of(guarded)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_unknown_policy_is_a_user_error(tmp_path):
    from hotloop.errors import UserError
    with pytest.raises(UserError, match="on_nonfinite 'ignore'"):
        make_trainer(tmp_path / "r", max_steps=2, on_nonfinite="ignore")


def test_skip_discards_a_nan_update_when_the_clip_is_folded_into_the_learning_rate(tmp_path):
    """clip_via_lr: a NaN norm makes the step's lr NaN; the skip hooks still restore the update."""
    hp_text = HP + ",optimizer=sgd,learning_rate=0.1,weight_decay=0.0,max_grad_norm=0.5"
    batches = _batches(5)
    skipped = make_trainer(tmp_path / "a", hp=tiny_hp(hp_text), max_steps=5, train_reader=ListReader(batches),
                           loss_fn=_nan_on(batches[1]), on_nonfinite="skip",
                           strategy=Strategy(prefetch=0, sync_every=2, clip_via_lr=True))
    assert skipped.fit().nonfinite_steps == 1
    assert "clip: folded into the SGD learning rate" in skipped.step_fn.report
    assert skipped.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    reference = make_trainer(tmp_path / "b", hp=tiny_hp(hp_text), max_steps=4,
                             train_reader=ListReader(batches[:1] + batches[2:]),
                             strategy=Strategy(prefetch=0, sync_every=2, clip_via_lr=True))
    reference.fit()
    a, b = params_of(skipped), params_of(reference)
    assert all(torch.isfinite(v).all() for v in a.values())
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
