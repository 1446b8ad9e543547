"""Each seq2seq model learns a tiny problem, bodies swap, and mismatches are clear."""
import pytest
import torch
from torch import nn

from hotloop.engine import Strategy
from hotloop.engine.build import compile_step
from hotloop.hparams import get_hparams
from hotloop.models.base import ModelMismatchError
from hotloop.optim import build_optimizer
from hotloop.problems.base import ProblemSpec
from hotloop.registry import models, problems

SETS = {"transformer": "transformer_algorithmic", "mlp": "mlp_algorithmic",
        "lstm_seq2seq": "lstm_seq2seq_algorithmic"}


def _setup(name, **over):
    hp = get_hparams(SETS[name], dict(batch_size=16, train_length=4, eval_length=4, hidden_size=32,
                                      **over))
    problem = problems.get("algorithmic_copy")()
    torch.manual_seed(0)
    model = models.get(name)(hp, problem.spec(hp))
    return hp, problem, model


@pytest.mark.parametrize("name", sorted(SETS))
def test_model_loss_decreases_in_a_short_run(name):
    hp, problem, model = _setup(name)
    step = compile_step(model, None, build_optimizer(model.parameters(), hp), Strategy(),
                        max_grad_norm=hp.max_grad_norm)
    batches = list(problem.reader("train", hp))[:4]
    first = step([batches[0]]).loss.item()
    for _ in range(25):
        for batch in batches:
            last = step([batch]).loss.item()
    assert last < 0.5 * first


@pytest.mark.parametrize("name", sorted(SETS))
def test_logits_shape_and_eval_stats(name):
    hp, problem, model = _setup(name)
    batch = next(iter(problem.reader("valid", hp)))
    model.eval()
    out = model.loss(batch, with_accuracy=True)
    assert out.logits.shape == (*batch["targets"].shape, problem.spec(hp).target_vocab_size)
    assert int(out.stats["tokens"]) == int((batch["targets"] != 0).sum())
    assert 0 <= int(out.stats["seq_correct"]) <= batch["targets"].shape[0]


class DoubleBody(nn.Module):
    """A stand-in body with the transformer's (src, tgt, pad) -> [B, T, H] contract."""

    def forward(self, src, tgt, src_pad):
        return 2 * tgt


def test_transformer_body_is_swappable():
    hp = get_hparams("transformer_algorithmic", "hidden_size=16,train_length=4,eval_length=4")
    spec = problems.get("algorithmic_copy")().spec(hp)
    model = models.get("transformer")(hp, spec, body=DoubleBody())
    batch = next(iter(problems.get("algorithmic_copy")().reader("train", hp.replace(batch_size=2))))
    logits, _ = model(batch)
    assert logits.shape[:2] == batch["targets"].shape
    assert isinstance(model.body, DoubleBody)


def test_problem_model_mismatch_is_clear():
    spec = ProblemSpec(task="lm", input_vocab_size=10, target_vocab_size=10)
    with pytest.raises(ModelMismatchError, match="task is 'lm'"):
        models.get("transformer")(get_hparams("transformer_algorithmic"), spec)


def test_hparams_of_another_model_are_refused_by_name():
    from hotloop.problems.synthetic_images import SyntheticImageHParams
    image_hp = SyntheticImageHParams(image_size=8)        # the problem's fields, no conv_channels
    spec = problems.get("image_synthetic")().spec(image_hp)
    with pytest.raises(ModelMismatchError, match="reads ConvNetHParams fields.*SyntheticImageHParams"):
        models.get("conv_net")(image_hp, spec)
    hp = get_hparams("conv_net_base", "image_size=8,image_channels=2,conv_channels=4:6")
    net = models.get("conv_net")(hp, spec)
    convs = [m for m in net.body if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(2, 4), (4, 6)]
