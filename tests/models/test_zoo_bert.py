"""BERT: shapes, the BERT-base parameter count, tied MLM output, padding mask, a short overfit run."""
import pytest
import torch

from hotloop.models.bert import BERT, BertHParams, bert_base
from hotloop.models.resnet import count_parameters
from hotloop.problems.base import ProblemSpec

pytestmark = pytest.mark.usefixtures("one_thread")   # the shared fixture of tests/conftest.py



def _spec(vocab, length=16, predictions=4):
    return ProblemSpec(task="pretrain", input_vocab_size=vocab, target_vocab_size=vocab,
                       max_input_length=length, max_target_length=predictions, pad_id=0)


def _tiny(**over):
    base = dict(hidden_size=16, num_layers=2, num_heads=2, filter_size=32, max_positions=32, dropout=0.0,
                attention_dropout=0.0, max_length=16, max_predictions=4)
    return BertHParams(**{**base, **over})


def _batch(gen, b=3, t=16, p=4, vocab=50):
    inputs = torch.randint(5, vocab, (b, t), generator=gen)
    inputs[:, 0] = 3
    inputs[:, -3:] = 0                                              # padding at the end
    segments = torch.zeros(b, t, dtype=torch.long)
    segments[:, 6:-3] = 1
    positions = torch.stack([torch.randperm(t - 4, generator=gen)[:p] + 1 for _ in range(b)])
    targets = torch.randint(5, vocab, (b, p), generator=gen)
    targets[0, -1] = 0                                              # one unused prediction slot
    return {"inputs": inputs, "segment_ids": segments, "mlm_positions": positions, "targets": targets,
            "nsp_targets": torch.tensor([0, 1, 0][:b])}


def test_forward_backward_shapes_and_stats():
    torch.manual_seed(0)
    model = BERT(_tiny(), _spec(50))
    batch = _batch(torch.Generator().manual_seed(0))
    out = model.loss(batch, with_accuracy=True)
    assert out.logits.shape == (3, 4, 50)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert int(out.stats["tokens"]) == 11 and int(out.stats["examples"]) == 3
    assert 0 <= int(out.stats["nsp_correct"]) <= 3 and float(out.stats["nsp_nll_sum"]) > 0


def test_ignored_next_sentence_targets():
    torch.manual_seed(0)
    model = BERT(_tiny(), _spec(50))
    batch = _batch(torch.Generator().manual_seed(0))
    partial = model.loss(dict(batch, nsp_targets=torch.tensor([0, -100, 1])), with_accuracy=True)
    full = model.loss(batch, with_accuracy=True)
    _, nsp_logits = model.heads(batch)
    nll = torch.nn.functional.cross_entropy(nsp_logits[[0, 2]], torch.tensor([0, 1]), reduction="sum")
    torch.testing.assert_close(partial.stats["nsp_nll_sum"], nll)
    assert int(partial.stats["nsp_examples"]) == 2 and int(full.stats["nsp_examples"]) == 3
    none = model.loss(dict(batch, nsp_targets=torch.full((3,), -100)))
    assert float(none.stats["nsp_nll_sum"]) == 0 and torch.isfinite(none.loss)
    mlm_only = float(none.loss.detach())
    assert mlm_only == pytest.approx(float(full.stats["nll_sum"]) / int(full.stats["tokens"]), rel=1e-5)


def test_bert_base_has_110m_parameters():
    hp = bert_base()
    vocab, h, f, layers = 30522, 768, 3072, 12
    layer = 4 * (h * h + h) + 2 * 2 * h + (h * f + f) + (f * h + h)
    encoder = (vocab + 512 + 2) * h + 2 * h + layers * layer + (h * h + h)   # = Hugging Face BertModel
    assert encoder == 109_482_240
    heads = (h * h + h) + 2 * h + vocab + (2 * h + 2)             # MLM transform + LN + bias, NSP
    total = count_parameters(lambda: BERT(hp, _spec(vocab, 128, 20)))
    assert total == encoder + heads == 110_106_428


def test_mlm_output_is_tied_to_the_word_embedding():
    torch.manual_seed(0)
    model = BERT(_tiny(), _spec(50))
    batch = _batch(torch.Generator().manual_seed(1))
    assert not any(p.shape == (50, 16) for n, p in model.named_parameters() if "word_embedding" not in n)
    model.loss(batch).loss.backward()
    unused = sorted(set(range(5, 50)) - set(batch["inputs"].flatten().tolist()))
    assert unused, "the test batch must leave some vocabulary rows unused as inputs"
    # rows never fed as inputs get gradient only through the tied MLM output layer
    assert model.word_embedding.weight.grad[unused].abs().sum(1).gt(0).all()


def test_padding_is_masked_out():
    torch.manual_seed(0)
    model = BERT(_tiny(), _spec(50)).eval()
    batch = _batch(torch.Generator().manual_seed(2))
    changed = dict(batch, inputs=batch["inputs"].clone())
    before = model.encode(batch)
    changed["inputs"][:, -3:] = 0
    changed["segment_ids"] = batch["segment_ids"].clone()
    changed["segment_ids"][:, -3:] = 1                            # segment of pads must not matter
    after = model.encode(changed)
    torch.testing.assert_close(before[:, :-3], after[:, :-3])
    other = dict(batch, inputs=batch["inputs"].clone())
    other["inputs"][:, 1] = 7                                     # a real token does matter
    assert not torch.allclose(model.encode(other)[:, 0], before[:, 0])


def test_short_run_overfits_a_batch():
    torch.manual_seed(0)
    model = BERT(_tiny(), _spec(50))
    batch = _batch(torch.Generator().manual_seed(3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(40):
        loss = model.loss(batch).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first
