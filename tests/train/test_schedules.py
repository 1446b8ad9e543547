"""LR schedules at hand-computed steps, per-group ``lr_scale``, a callback owning the LR, resume."""
from __future__ import annotations

import math

import pytest
import torch

from helpers import StopAt, make_trainer, tiny_hp
from hotloop.errors import UserError
from hotloop.hparams import HParams
from hotloop.registry import lr_schedules
from hotloop.schedules import LRClaimError, LRControl, build_schedule
from hotloop.train import Callback, Event


def _mult(name: str, step: int, epoch: int = 0, steps_per_epoch: int | None = None, **hp) -> float:
    return build_schedule(HParams(lr_schedule=name, **hp), steps_per_epoch).multiplier(step, epoch)


# learning_rate 1, warmup 4 steps, 14 steps in all (10 of decay), floor 0.1
DECAY = dict(learning_rate=1.0, warmup_steps=4, max_steps=14, min_lr_ratio=0.1)


@pytest.mark.parametrize("step,expected", [
    (0, 0.25), (1, 0.5), (3, 1.0),      # warmup: (step + 1) / 4, its end at step 3
    (4, 1.0),                           # the decay starts after warmup
    (9, 0.55),                          # mid-decay: 0.1 + 0.9 * (1 - 5/10)
    (11, 0.37),                         # 0.1 + 0.9 * (1 - 7/10)
    (14, 0.1), (40, 0.1)])              # the end, then the floor
def test_linear_warmup_then_decay_to_the_floor(step, expected):
    assert _mult("linear", step, **DECAY) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("step,expected", [
    (0, 0.25), (3, 1.0), (4, 1.0),
    (6, 0.9140576474687263),            # 0.1 + 0.9 * (1 + cos(0.2 pi)) / 2 = 0.1 + 0.45 * 1.809017
    (9, 0.55),                          # halfway: 0.1 + 0.45
    (14, 0.1), (99, 0.1)])
def test_cosine_warmup_then_decay_to_the_floor(step, expected):
    assert _mult("cosine", step, **DECAY) == pytest.approx(expected, abs=1e-12)


def test_cosine_does_not_decay_during_warmup():
    # a decay counted from step 0 would give 0.5 * (1 + cos(pi * 3 / 14)) = 0.89 at warmup's end
    assert _mult("cosine", 3, learning_rate=1.0, warmup_steps=4, max_steps=14) == 1.0
    assert _mult("cosine", 2, learning_rate=1.0, warmup_steps=4, max_steps=14) == 0.75


def test_cosine_without_warmup_keeps_its_values():
    assert _mult("cosine", 7, max_steps=14) == pytest.approx(0.5)
    assert _mult("cosine", 0, max_steps=14) == 1.0
    assert _mult("cosine", 14, max_steps=14) == pytest.approx(0.0, abs=1e-15)


def test_decay_over_epochs_and_without_a_known_end():
    # max_epochs 2 x 7 steps = 14 steps, as above
    assert _mult("linear", 9, steps_per_epoch=7, learning_rate=1.0, warmup_steps=4, max_epochs=2,
                 min_lr_ratio=0.1) == pytest.approx(0.55)
    assert _mult("linear", 50, learning_rate=1.0, warmup_steps=4, max_steps=0, max_epochs=0) == 1.0


@pytest.mark.parametrize("name", ["rsqrt_decay", "inverse_sqrt"])
def test_inverse_sqrt_after_warmup_and_its_floor(name):
    assert issubclass(lr_schedules.get(name), lr_schedules.get("rsqrt_decay"))   # the same values
    assert _mult(name, 1, warmup_steps=4) == 0.5
    assert _mult(name, 3, warmup_steps=4) == 1.0             # warmup end
    assert _mult(name, 15, warmup_steps=4) == 0.5            # sqrt(4 / 16)
    assert _mult(name, 99, warmup_steps=4) == pytest.approx(0.2)
    assert _mult(name, 99, warmup_steps=4, min_lr_ratio=0.3) == 0.3   # the floor
    assert _mult(name, 15, warmup_steps=4, min_lr_ratio=0.3) == 0.5   # above it: unchanged


def test_min_lr_is_an_absolute_floor():
    # learning_rate 0.5, min_lr 0.05: the multiplier ends at 0.1
    assert _mult("linear", 14, learning_rate=0.5, warmup_steps=4, max_steps=14, min_lr=0.05) == \
        pytest.approx(0.1)
    assert _mult("constant", 0, warmup_steps=4) == 0.25 and _mult("constant", 9, warmup_steps=4) == 1.0


def test_epoch_decay_and_plateau_keep_their_values_above_the_floor():
    assert _mult("epoch_decay", 0, epoch=5, lr_decay=0.5, lr_decay_start_epoch=4) == 0.25
    assert _mult("epoch_decay", 0, epoch=9, lr_decay=0.5, lr_decay_start_epoch=4, min_lr_ratio=0.1) == 0.1
    plateau = build_schedule(HParams(lr_schedule="plateau", lr_decay=0.5, min_lr_ratio=0.3))
    for loss in (2.0, 3.0, 3.0, 3.0):
        plateau.on_eval(loss)
    assert plateau.multiplier(0, 0) == 0.3    # 0.5, 0.25 -> held at the floor


@pytest.mark.parametrize("hp,words", [
    (dict(min_lr=0.01, min_lr_ratio=0.1), "not both"),
    (dict(learning_rate=0.01, min_lr=0.1), "must not exceed"),
    (dict(min_lr_ratio=1.5), "[0, 1]"),
    (dict(min_lr=-1.0), ">= 0")])
def test_bad_floors_are_one_line_user_errors(hp, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")):
        build_schedule(HParams(lr_schedule="linear", **hp))


def _two_groups() -> torch.optim.Optimizer:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr_scale": 0.1}], lr=1.0)


def test_each_group_keeps_its_lr_scale_under_the_schedule():
    optimizer = _two_groups()
    control = LRControl(build_schedule(HParams(lr_schedule="linear", **DECAY)), base_lr=2.0)
    assert control.apply(optimizer.param_groups, 9, 0) == pytest.approx(1.1)   # 2.0 * 0.55
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1.1, 0.11])


def test_an_owner_takes_the_lr_over_and_a_second_cannot():
    optimizer = _two_groups()
    control = LRControl(build_schedule(HParams(lr_schedule="constant")), base_lr=2.0)
    owner = object()
    control.claim(owner)
    for group in optimizer.param_groups:
        group["lr"] = 0.3 * group.get("lr_scale", 1.0)
    assert control.apply(optimizer.param_groups, 5, 0) is None          # not written
    assert control.current(optimizer.param_groups) == pytest.approx(0.3)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.3, 0.03])
    with pytest.raises(LRClaimError, match="already owned"):
        control.claim(object())
    control.release(owner)
    assert control.apply(optimizer.param_groups, 5, 0) == 2.0


class GroupLRs(Callback):
    """Records every group's LR at each step's end; optionally owns the LR: step s (1-based) runs at
    ``0.01 * s`` x the group's scale, written before the first step and after each one (not at
    ``STEP_START``, so a schedule that wrote anyway would be seen)."""

    def __init__(self, own: bool = False) -> None:
        self.own, self.lrs = own, {}

    def _write(self, trainer, step: int) -> None:
        for group in trainer.optimizer.param_groups:
            group["lr"] = 0.01 * step * group.get("lr_scale", 1.0)

    def on_event(self, event, trainer, **info):
        if event is Event.FIT_START and self.own:
            trainer.lr_control.claim(self)
            self._write(trainer, trainer.step + 1)
        elif event is Event.STEP_END:
            self.lrs[trainer.step] = [g["lr"] for g in trainer.optimizer.param_groups]
            if self.own:
                self._write(trainer, trainer.step + 1)


def test_a_callback_owns_the_lr_in_the_trainer(out):
    recorder = GroupLRs(own=True)
    trainer = make_trainer(out, tiny_hp("lr_schedule=linear,warmup_steps=2,learning_rate=0.5"), max_steps=4,
                           callbacks=[recorder], loggers=[])
    trainer.optimizer.param_groups[0]["lr_scale"] = 0.5
    trainer.fit()
    assert recorder.lrs == {s: [pytest.approx(0.005 * s)] for s in range(1, 5)}
    assert trainer.lr == pytest.approx(0.04)      # the base LR of step 4: the group's rate without its scale


def test_the_trainer_writes_the_schedule_times_the_group_scale(out):
    recorder = GroupLRs()
    hp = tiny_hp("lr_schedule=linear,warmup_steps=2,learning_rate=0.5,min_lr_ratio=0.2")
    trainer = make_trainer(out, hp, max_steps=6, callbacks=[recorder], loggers=[])
    trainer.optimizer.param_groups[0]["lr_scale"] = 0.1
    trainer.fit()
    # step s (1-based) ran at multiplier(s - 1): 0.5, 1, then 1 - 0.8 * k / 4 for k = 0..3
    expected = [0.5, 1.0, 1.0, 0.8, 0.6, 0.4]
    assert [recorder.lrs[s][0] for s in range(1, 7)] == pytest.approx([0.05 * m for m in expected])


def test_resume_mid_schedule_gives_the_same_lrs(out, tmp_path):
    hp = tiny_hp("lr_schedule=cosine,warmup_steps=3,learning_rate=0.5,min_lr_ratio=0.1")
    straight = GroupLRs()
    make_trainer(tmp_path / "straight", hp, max_steps=8, callbacks=[straight], loggers=[]).fit()
    make_trainer(out, hp, max_steps=8, callbacks=[StopAt(4)], loggers=[]).fit()
    resumed = GroupLRs()
    make_trainer(out, hp, max_steps=8, callbacks=[resumed], loggers=[]).fit(resume=True)
    assert sorted(resumed.lrs) == [5, 6, 7, 8]
    assert all(resumed.lrs[s] == straight.lrs[s] for s in range(5, 9))
    assert straight.lrs[3][0] == 0.5 and straight.lrs[8][0] == pytest.approx(
        0.5 * (0.1 + 0.45 * (1 + math.cos(math.pi * 4 / 5))))
