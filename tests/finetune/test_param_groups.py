"""Parameter groups: no weight decay on biases and norm weights (adamw by default), layer-wise LR
decay scales and the effective learning rates the Trainer sets, freezing the body for N steps."""
from __future__ import annotations

import pytest
import torch

from finetune_helpers import state_of, tiny_bert, tiny_bert_hp, tiny_trainer
from hotloop.errors import UserError
from hotloop.param_groups import param_groups
from hotloop.train.events import Callback, Event
from hotloop.train.setup import TrainerError


def _by_name(groups):
    return {name: g for g in groups for name in g["param_names"]}


def test_adamw_decays_matrices_and_embeddings_but_not_biases_or_norms():
    model = tiny_bert()
    groups = _by_name(param_groups(model, tiny_bert_hp()))
    assert groups["layers.0.qkv.weight"]["weight_decay"] == 0.01
    assert groups["word_embedding.weight"]["weight_decay"] == 0.01
    for name in ("layers.0.qkv.bias", "layers.1.attn_norm.weight", "embed_norm.weight", "classifier.bias"):
        assert groups[name]["weight_decay"] == 0.0, name
    assert set(groups) == {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("optimizer,switch,split", [("adamw", None, True), ("adamw", False, False),
                                                    ("sgd", None, False), ("sgd", True, True)])
def test_the_exclusion_follows_the_hparam(optimizer, switch, split):
    hp = tiny_bert_hp(optimizer=optimizer, no_decay_bias_norm=switch)
    decays = {g["weight_decay"] for g in param_groups(tiny_bert(hp), hp)}
    assert decays == ({0.0, 0.01} if split else {0.01})


def test_layerwise_decay_scales_each_layer_below_the_top():
    hp = tiny_bert_hp(layerwise_lr_decay=0.5)
    groups = _by_name(param_groups(tiny_bert(hp), hp))
    # depths: embeddings 0, layers 1 and 2, pooler and classifier 3 (the top keeps the base LR)
    expected = {"word_embedding.weight": 0.125, "embed_norm.bias": 0.125, "layers.0.ffn_in.weight": 0.25,
                "layers.1.qkv.bias": 0.5, "pooler.weight": 1.0, "classifier.weight": 1.0}
    for name, scale in expected.items():
        assert groups[name]["lr_scale"] == scale, name
        assert groups[name]["lr"] == pytest.approx(1e-3 * scale)


def test_the_trainer_sets_each_group_its_scaled_rate():
    hp = tiny_bert_hp(layerwise_lr_decay=0.5, lr_schedule="cosine", max_steps=3)
    trainer = tiny_trainer(hp=hp)
    seen = []

    class Rates(Callback):
        def on_event(self, event, trainer, **info):
            if event is Event.STEP_END:
                seen.append({g["lr_scale"]: g["lr"] for g in trainer.optimizer.param_groups})

    trainer.callbacks.append(Rates())
    trainer.fit()
    for step, rates in enumerate(seen):
        base = hp.learning_rate * trainer.schedule.multiplier(step, 0)
        assert base > 0 and rates == {s: pytest.approx(base * s) for s in (1.0, 0.5, 0.25, 0.125)}


def test_layerwise_decay_needs_a_model_that_knows_its_layers():
    hp = tiny_bert_hp(layerwise_lr_decay=0.8)
    with pytest.raises(UserError, match="does not say which layer each parameter is in"):
        param_groups(torch.nn.Linear(2, 2), hp)
    with pytest.raises(UserError, match=r"layerwise_lr_decay must be in \(0, 1\]"):
        param_groups(tiny_bert(), tiny_bert_hp(layerwise_lr_decay=1.5))


def test_the_body_is_frozen_for_n_steps_then_trains():
    hp = tiny_bert_hp(freeze_body_steps=2, max_steps=3)
    trainer = tiny_trainer(hp=hp)
    start = state_of(trainer.model)
    body = [n for n in start if not n.startswith("classifier")]
    seen = {}

    class Watch(Callback):
        def on_event(self, event, trainer, **info):
            if event is Event.STEP_END:
                names = {id(p): n for n, p in trainer.model.named_parameters()}
                with_state = {names[id(p)] for p in trainer.optimizer.state}
                seen[info["step"]] = (state_of(trainer.model), with_state)

    trainer.callbacks.callbacks.insert(0, Watch())          # before the freeze callback unfreezes
    trainer.fit()
    for step in (1, 2):
        weights, with_state = seen[step]
        assert all(torch.equal(weights[n], start[n]) for n in body), step
        assert with_state == {"classifier.weight", "classifier.bias"}   # no optimizer state for the body
        assert not torch.equal(weights["classifier.weight"], start["classifier.weight"])
    weights, with_state = seen[3]
    assert not torch.equal(weights["layers.0.qkv.weight"], start["layers.0.qkv.weight"])
    assert "layers.0.qkv.weight" in with_state
    assert any("frozen until step 2" in n for n in trainer.notices)
    assert all(p.requires_grad for p in trainer.model.parameters())


def test_freezing_needs_a_declared_head():
    hp = tiny_bert_hp(freeze_body_steps=1)
    model = tiny_bert(hp)
    model.head_prefixes = ()
    with pytest.raises(TrainerError, match="declares no head"):
        tiny_trainer(model, hp=hp).fit()


def test_a_one_group_adamw_state_resumes_into_the_grouped_optimizer():
    """A checkpoint from before parameter groups (one AdamW group over every parameter) loads into
    the decay / no-decay groups: each parameter keeps its own moments and step count."""
    from hotloop.optim import build_optimizer
    from hotloop.train.context import LocalContext
    from hotloop.train.stateful import OptimizerState
    hp = tiny_bert_hp()
    model = tiny_bert(hp)
    old = torch.optim.AdamW(model.parameters(), lr=hp.learning_rate, weight_decay=0.01)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    old.step()
    saved = old.state_dict()
    grouped = build_optimizer(param_groups(model, hp), hp, fused=False)
    assert len(grouped.param_groups) > 1
    OptimizerState(grouped, LocalContext(), model).load_state_dict(saved)
    for p in model.parameters():
        assert torch.equal(grouped.state[p]["exp_avg"], old.state[p]["exp_avg"])
        assert torch.equal(grouped.state[p]["exp_avg_sq"], old.state[p]["exp_avg_sq"])
    by_name = _by_name(grouped.param_groups)
    assert by_name["layers.0.qkv.bias"]["weight_decay"] == 0.0                 # the group keeps its own decay
    assert by_name["layers.0.qkv.weight"]["weight_decay"] == 0.01
