"""Strategy.dropout_masks for any model: every nn.Dropout (and BERT's attention) draws bits16 masks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hotloop.engine.build import build_step
from hotloop.engine.dropout_masks import MaskedDropout, use_dropout_masks
from hotloop.engine.strategy import Strategy, StrategyError, validate_for_model
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput
from hotloop.models.bert import BERT, BertHParams
from hotloop.ops import dropout as dropout_ops
from hotloop.optim import build_optimizer
from hotloop.param_groups import param_groups
from hotloop.problems.base import ProblemSpec

pytestmark = pytest.mark.usefixtures("one_thread")

BITS16 = Strategy(dropout_masks="bits16")


class UserNet(nn.Module):
    """A user's model: own dropouts (one shared by two places, one with p=0, a channel dropout)
    and torch's transformer layers (dropout, dropout1..3 each)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.3)
        self.block = nn.Sequential(nn.Linear(16, 16), self.drop, nn.Dropout(0.0))
        self.channels = nn.Dropout2d(0.2)
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.decoder = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # [B, T, 8] -> [B, T, 16]
        h = self.block(self.drop(self.inp(x)))
        return self.decoder(h, self.encoder(h))


def _user_loss(model: nn.Module, batch, state) -> LossOutput:
    return LossOutput(model(batch["x"]).pow(2).mean(), {})


def test_every_plain_dropout_is_swapped_once_and_eval_and_state_are_unchanged() -> None:
    torch.manual_seed(0)
    model = UserNet().eval()
    x = torch.randn(3, 5, 8)
    before, keys = model(x), {k: v.clone() for k, v in model.state_dict().items()}
    assert use_dropout_masks(model, "bits16") == ["dropout masks: bits16 in 8 nn.Dropout modules"]
    swapped = [m for m in model.modules() if isinstance(m, MaskedDropout)]
    assert len(swapped) == 8 and all(m.masks == "bits16" and not m.training for m in swapped)
    assert model.drop is model.block[1] and isinstance(model.drop, MaskedDropout)    # shared: one module
    assert type(model.block[2]) is nn.Dropout and type(model.channels) is nn.Dropout2d
    for layer, names in ((model.encoder, ("dropout", "dropout1", "dropout2")),
                         (model.decoder, ("dropout", "dropout1", "dropout2", "dropout3"))):
        assert all(isinstance(getattr(layer, n), MaskedDropout) for n in names)
    assert torch.equal(model(x), before)                                                # eval: no masks
    assert model.state_dict().keys() == keys.keys()
    assert all(torch.equal(v, keys[k]) for k, v in model.state_dict().items())
    assert use_dropout_masks(model, "bits16") == ["dropout masks: bits16 in 8 nn.Dropout modules"]
    assert [m for m in model.modules() if isinstance(m, MaskedDropout)] == swapped      # not wrapped twice


def test_bits16_masks_drop_at_rate_p_keep_the_expectation_and_bernoulli_is_nn_dropout() -> None:
    torch.manual_seed(0)
    p, n = 0.3, 1 << 20
    layer = MaskedDropout(p).train()
    x = torch.ones(n, requires_grad=True)
    y = layer(x)
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(float((y == 0).float().mean()) - p) < 5 * sigma
    assert abs(float(y.detach().mean()) - 1.0) < 5 * sigma / (1 - p)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())                      # backward: the same mask
    assert not torch.equal(layer(x), y)                         # a new mask each call
    plain, layer.masks = nn.Dropout(p), "bernoulli"
    torch.manual_seed(1)
    ref = plain(x)
    torch.manual_seed(1)
    assert torch.equal(layer(x), ref)


def test_a_user_model_trains_with_bits16_and_a_model_without_dropout_refuses_it() -> None:
    torch.manual_seed(0)
    model = UserNet()
    built = build_step(model, HParams(), BITS16, loss_fn=_user_loss, optimizer=lambda params, fused: torch.optim.SGD(params, lr=0.1))
    assert "dropout masks: bits16 in 8 nn.Dropout modules" in built.step.report
    losses = [float(built.step([{"x": torch.randn(4, 5, 8)}], None).loss) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    with pytest.raises(StrategyError, match="dropout_masks: Linear does not read this formulation field"):
        validate_for_model(BITS16, nn.Linear(2, 2))
    with pytest.raises(StrategyError, match="reads none; dropout_masks needs an nn.Dropout with p > 0"):
        validate_for_model(BITS16, nn.Sequential(nn.Conv2d(2, 2, 3), nn.Dropout(0.0)))


def bert_tiny(dropout: float = 0.1) -> tuple[BERT, BertHParams]:
    hp = BertHParams(hidden_size=16, num_layers=2, num_heads=2, filter_size=32, max_positions=32, dropout=dropout,
                     attention_dropout=dropout, max_length=16, max_predictions=4, optimizer="adamw",
                     learning_rate=1e-3)
    spec = ProblemSpec(task="pretrain", input_vocab_size=50, target_vocab_size=50, max_input_length=16,
                       max_target_length=4, pad_id=0)
    return BERT(hp, spec), hp


def bert_batch(gen: torch.Generator, b: int = 4, t: int = 16, p: int = 4, vocab: int = 50) -> dict:
    inputs = torch.randint(5, vocab, (b, t), generator=gen)
    inputs[:, 0], inputs[:, -3:] = 3, 0                                    # [CLS], padding at the end
    segments = torch.zeros(b, t, dtype=torch.long)
    segments[:, 6:-3] = 1
    positions = torch.stack([torch.randperm(t - 4, generator=gen)[:p] + 1 for _ in range(b)])
    return {"inputs": inputs, "segment_ids": segments, "mlm_positions": positions,
            "targets": torch.randint(5, vocab, (b, p), generator=gen), "nsp_targets": torch.arange(b) % 2}


def _train(model: BERT, hp: BertHParams, strategy: Strategy, steps: int = 4) -> tuple[list[float], list[str]]:
    step = build_step(model, hp, strategy).step
    gen = torch.Generator().manual_seed(0)
    batches = [bert_batch(gen) for _ in range(steps)]
    torch.manual_seed(5)
    return [float(step([b], None).loss) for b in batches], step.report


def test_bert_with_bits16_masks_its_attention_and_keeps_its_checkpoint(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    model, hp = bert_tiny()
    keys = list(model.state_dict())
    shapes = []
    real = dropout_ops.dropout_mask
    monkeypatch.setattr(dropout_ops, "dropout_mask", lambda *a, **k: shapes.append(tuple(a[0])) or real(*a, **k))
    losses, report = _train(model, hp, BITS16)
    assert "dropout masks: bits16 in 3 nn.Dropout modules" in report          # embeddings + one per layer
    assert shapes.count((4, 2, 16, 16)) == 2 * 4                                # attention weights [B, nh, T, T]
    assert len(shapes) == (2 * 3 + 1) * 4 and all(torch.isfinite(torch.tensor(losses)))
    assert list(model.state_dict()) == keys
    torch.save(model.state_dict(), tmp_path / "bert.pt")
    fresh, _ = bert_tiny()
    fresh.load_state_dict(torch.load(tmp_path / "bert.pt", weights_only=True), strict=True)
    batch = bert_batch(torch.Generator().manual_seed(9))
    assert torch.equal(fresh.eval().loss(batch).loss, model.eval().loss(batch).loss)


def test_bernoulli_masks_change_nothing() -> None:
    torch.manual_seed(0)
    model, hp = bert_tiny()
    losses, report = _train(model, hp, Strategy())
    assert not any(isinstance(m, MaskedDropout) for m in model.modules())
    assert not any("dropout masks" in line for line in report)
    torch.manual_seed(0)
    plain, _ = bert_tiny()                     # the same steps without build_step's formulation hand-over
    opt = build_optimizer(param_groups(plain, hp), hp, fused=False)
    gen = torch.Generator().manual_seed(0)
    batches = [bert_batch(gen) for _ in range(4)]
    torch.manual_seed(5)
    ref = []
    for b in batches:
        opt.zero_grad()
        loss = plain.loss(b).loss
        loss.backward()
        if hp.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(plain.parameters(), hp.max_grad_norm)
        opt.step()
        ref.append(float(loss))
    assert losses == ref


def test_the_captured_graph_draws_the_masks_eager_draws() -> None:
    """backend=graph captures bits16 masks (their words are one traced op) and trains bitwise as eager."""
    losses = {}
    for strategy in (BITS16, Strategy(dropout_masks="bits16", backend="graph")):
        torch.manual_seed(0)
        model, hp = bert_tiny()
        losses[strategy.backend], report = _train(model, hp, strategy)
    assert [line for line in report if line.startswith("captured graph #1")], report   # not a fallback
    assert losses["graph"] == losses["eager"]
