"""``on_nonfinite="skip"`` with a phased step (CycleGAN: a generator phase, then a discriminator phase).

A NaN loss in one phase at one step discards that phase's update (its parameters come out as if
its gradients had been zero, which for plain SGD without momentum or weight decay is no update
at all), keeps the other phase's update of that step, and counts the step once; everything else
is bitwise the run without the NaN.
"""
from __future__ import annotations

import pytest
import torch

from helpers import params_of
from hotloop.engine import Strategy
from hotloop.hparams import get_hparams
from hotloop.models.cyclegan import CycleGAN
from hotloop.registry import problems
from hotloop.train import Trainer

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("one_thread")]
STEPS, AT = 4, 2
HP = ("image_size=16,gen_filters=4,gen_blocks=1,disc_filters=4,disc_layers=2,pool_size=3,batch_size=2,"
      "train_examples=16,eval_examples=4,optimizer=sgd,momentum=0.0,weight_decay=0.0,learning_rate=0.05,"
      "lr_schedule=constant,warmup_steps=0")


class ScaledPhase(CycleGAN):
    """CycleGAN whose ``phase`` loss is multiplied by ``factor`` at its ``at``-th training step."""

    def __init__(self, hp, spec, phase: str, at: int, factor: float) -> None:
        super().__init__(hp, spec)
        self.scaled_phase, self.at, self.factor, self.calls = phase, at, factor, 0

    def _scaled(self, out, phase: str):
        if phase == self.scaled_phase and self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at:
                out.loss = out.loss * self.factor
        return out

    def generator_loss(self, batch):
        return self._scaled(super().generator_loss(batch), "generator")

    def discriminator_loss(self, batch):
        return self._scaled(super().discriminator_loss(batch), "discriminator")


def _run(phase: str, factor: float, policy: str = "skip") -> tuple[dict[str, torch.Tensor], int]:
    """The parameters after the run and its count of discarded steps."""
    hp = get_hparams("cyclegan_small", HP)
    problem = problems.get("shapes_unpaired")()
    torch.manual_seed(hp.seed)
    model = ScaledPhase(hp, problem.spec(hp), phase, AT, factor)
    trainer = Trainer(problem, model, hp, strategy=Strategy(prefetch=0, sync_every=1), max_steps=STEPS,
                      loggers=[], on_nonfinite=policy)
    result = trainer.fit()
    return params_of(trainer), result.nonfinite_steps


@pytest.mark.parametrize("phase", ["generator", "discriminator"])
def test_a_nan_in_one_phase_discards_only_that_phases_update(phase):
    skipped, count = _run(phase, float("nan"))
    assert count == 1                                                 # the step counted once
    zero_grad, none = _run(phase, 0.0, policy="stop")                 # that phase's gradients zero at that step
    plain, _ = _run(phase, 1.0)
    assert none == 0
    assert all(torch.isfinite(v).all() for v in skipped.values())
    assert [k for k in skipped if not torch.equal(skipped[k], zero_grad[k])] == []   # bitwise, every parameter
    own = {"generator": ("a_to_b.", "b_to_a."), "discriminator": ("disc_a.", "disc_b.")}[phase]
    assert any(k.startswith(own) and not torch.equal(skipped[k], plain[k]) for k in skipped)  # the update mattered
