"""Seq2seq models: tied/shared embeddings, unchanged parameter names, the registered hparams sets."""
from __future__ import annotations

import pytest
import torch

from hotloop.hparams import get_hparams, hparams_from_dict, hparams_to_dict
from hotloop.models.encoder_decoder import Seq2SeqHParams
from hotloop.problems.base import ProblemSpec
from hotloop.registry import models

torch.set_num_threads(1)


def _build(name: str, hp, vocab=(20, 20)):
    spec = ProblemSpec("seq2seq", vocab[0], vocab[1], 12, 12)
    torch.manual_seed(0)
    return models.get(name)(hp, spec)


@pytest.mark.parametrize("name", ["transformer", "lstm_seq2seq"])
def test_tied_and_shared_embeddings_train_one_parameter(name):
    small = dict(hidden_size=16, num_heads=2, filter_size=32, num_layers=1)
    untied = _build(name, Seq2SeqHParams(**small))
    tied = _build(name, Seq2SeqHParams(tie_embeddings=True, shared_embeddings=True, **small))
    assert set(untied.state_dict()) == set(tied.state_dict())          # checkpoints keep their names
    n_vocab = 20 * 16
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(tied) == 2 * n_vocab                  # output weight and source table shared
    assert tied.top.proj.weight is tied.tgt_bottom.tokens.weight is tied.src_bottom.tokens.weight
    batch = {"inputs": torch.randint(2, 20, (3, 5)), "targets": torch.randint(2, 20, (3, 4))}
    tied.loss(batch).loss.backward()
    shared = tied.tgt_bottom.tokens.weight
    assert shared.grad is not None and shared.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="shared_embeddings needs one vocabulary"):
        _build(name, Seq2SeqHParams(shared_embeddings=True, **small), vocab=(20, 30))


def test_transformer_parameter_names_unchanged():
    model = _build("transformer", get_hparams("transformer_algorithmic").replace(num_layers=1))
    names = set(model.state_dict())
    for expected in ("src_bottom.tokens.weight", "src_bottom.positions.weight", "tgt_bottom.tokens.weight",
                     "body.net.encoder.layers.0.self_attn.in_proj_weight", "body.net.encoder.norm.weight",
                     "body.net.decoder.layers.0.multihead_attn.in_proj_weight", "body.net.decoder.norm.bias",
                     "top.proj.weight", "top.proj.bias"):
        assert expected in names


def test_registered_hparams_sets_round_trip():
    base = get_hparams("transformer_base")
    assert (base.hidden_size, base.num_layers, base.num_heads, base.filter_size) == (512, 6, 8, 2048)
    assert base.tie_embeddings and base.label_smoothing == 0.1 and base.warmup_steps == 4000
    assert (base.adam_beta1, base.adam_beta2, base.lr_schedule) == (0.9, 0.98, "rsqrt_decay")
    small = get_hparams("transformer_base_small", "tie_embeddings=false")
    assert (small.hidden_size, small.num_layers, small.num_heads, small.filter_size) == (256, 3, 4, 1024)
    assert not small.tie_embeddings
    lstm = get_hparams("lstm_seq2seq_multi30k")
    assert hparams_from_dict(hparams_to_dict(lstm)) == lstm
    multi30k = get_hparams("transformer_multi30k")                       # a typed field there too
    assert multi30k.tie_embeddings is True and multi30k.shared_embeddings is True
