"""Step programs: a phased model (CycleGAN) trains like the hand-written GAN loop, and resumes bitwise."""
from __future__ import annotations

import copy

import torch

from hotloop.engine import Strategy, build_step
from hotloop.optim import build_optimizer
from hotloop.train import Trainer
from hotloop.compose.build import build_run

TINY = "image_size=32,gen_filters=4,disc_filters=4,gen_blocks=1,batch_size=2,pool_size=2,train_examples=16"


def _run():
    return build_run("shapes_unpaired", "cyclegan", "cyclegan_small", TINY)


def _batches(run, count):
    it = iter(run.problem.reader("train", run.hp))
    return [next(it) for _ in range(count)]


def test_phased_step_equals_the_hand_written_gan_loop():
    run = _run()
    batches = _batches(run, 3)
    reference = copy.deepcopy(run.model)
    groups = reference.parameter_groups()
    opt_g = build_optimizer(groups["generator"], run.hp, fused=False)
    opt_d = build_optimizer(groups["discriminator"], run.hp, fused=False)
    torch.manual_seed(5)
    for batch in batches:                                   # the loop users write for a GAN
        reference.zero_grad(set_to_none=True)
        reference.generator_loss(batch).loss.backward()
        opt_g.step()
        reference.zero_grad(set_to_none=True)
        reference.discriminator_loss(batch).loss.backward()
        opt_d.step()
    built = build_step(run.model, run.hp, Strategy(fused_optimizer=False))
    torch.manual_seed(5)
    for batch in batches:
        result = built.step([batch])
    assert "discriminator/disc_sum" in result.stats and "gan_sum" in result.stats
    for (name, p), q in zip(run.model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert list(built.optimizer.state_dict()["phases"]) == ["generator", "discriminator"]


def test_phased_run_resumes_bitwise(tmp_path):
    def trainer(out, steps):
        run = _run()
        return Trainer(run.problem, run.model, run.hp, strategy=Strategy(prefetch=0, sync_every=2),
                       output_dir=out, max_steps=steps, eval_every=0, eval_splits=(), loggers=[])

    straight = trainer(tmp_path / "a", 4)
    straight.fit()
    first = trainer(tmp_path / "b", 2)
    first.fit()
    resumed = trainer(tmp_path / "b", 4)
    resumed.fit(resume=True)
    assert resumed.step == 4
    for (name, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(p, q), name
    moments = resumed.optimizer["discriminator"].state_dict()["state"]
    assert moments and all(int(s["step"]) == 4 for s in moments.values())
