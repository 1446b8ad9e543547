"""The fused output projection + label-smoothed cross-entropy, alone and as the encoder-decoders'
``fused_ce`` formulation: the same loss, statistics and gradients as the plain logits path."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from hotloop.models.formulation import Formulation
from hotloop.models.fused_ce import linear_token_loss
from hotloop.models.lstm_seq2seq import LSTMSeq2Seq, lstm_seq2seq_multi30k
from hotloop.models.transformer import Transformer, transformer_base_small
from hotloop.problems.base import ProblemSpec

VOCAB = 29
SPEC = ProblemSpec("seq2seq", VOCAB, VOCAB, max_input_length=9, max_target_length=9)


def _inputs(rows: int = 13, width: int = 6, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=g).requires_grad_()
    weight = (0.5 * torch.randn(VOCAB, width, generator=g)).requires_grad_()
    bias = (0.1 * torch.randn(VOCAB, generator=g)).requires_grad_()
    targets = torch.randint(1, VOCAB, (rows,), generator=g)
    targets[[2, 7, 8]] = 0                                       # pad rows
    return hidden, weight, bias, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("gemm_dtype, tol", [(None, 1e-5), (torch.bfloat16, 2e-2)])
def test_matches_torch_label_smoothed_cross_entropy(smoothing, gemm_dtype, tol) -> None:
    hidden, weight, bias, targets = _inputs()
    loss, nll = linear_token_loss(hidden, weight, bias, targets, label_smoothing=smoothing, ignore_index=0,
                                  chunk_rows=4, gemm_dtype=gemm_dtype)
    got = torch.autograd.grad(loss, (hidden, weight, bias))
    ref_inputs = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias)]
    logits = F.linear(*ref_inputs)                                              # [N, V]
    want = F.cross_entropy(logits, targets, ignore_index=0, label_smoothing=smoothing, reduction="sum")
    want_nll = F.cross_entropy(logits.detach(), targets, ignore_index=0, reduction="sum")
    want_grads = torch.autograd.grad(want, ref_inputs)
    torch.testing.assert_close(loss, want, rtol=tol, atol=tol)
    torch.testing.assert_close(nll, want_nll, rtol=tol, atol=tol)
    assert not nll.requires_grad
    for g, w in zip(got, want_grads):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    assert torch.all(got[0][[2, 7, 8]] == 0)


def test_refuses_a_smoothing_outside_zero_one() -> None:
    hidden, weight, bias, targets = _inputs()
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_token_loss(hidden, weight, bias, targets, label_smoothing=1.5)


def _seq2seq_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(1, VOCAB, (4, 7), generator=g)
    targets = torch.randint(1, VOCAB, (4, 8), generator=g)
    targets[0, 5:] = 0                                                          # padded tails
    targets[2, 3:] = 0
    return {"inputs": inputs, "targets": targets}


def _pair(model_class, hp):
    """The model and a copy of it (same weights) computing with ``fused_ce``."""
    torch.manual_seed(0)
    plain = model_class(hp, SPEC)
    fused = copy.deepcopy(plain)
    fused.use_formulation(Formulation(fused_ce=True, ce_chunk_rows=5))
    return plain, fused


@pytest.mark.parametrize("model_class, hp", [
    (Transformer, transformer_base_small().replace(hidden_size=16, num_layers=1, num_heads=2, filter_size=32,
                                                   dropout=0.0)),
    (LSTMSeq2Seq, lstm_seq2seq_multi30k().replace(hidden_size=16, dropout=0.0))])
def test_encoder_decoder_fused_ce_matches_the_logits_path(model_class, hp) -> None:
    plain, fused = _pair(model_class, hp)
    assert hp.label_smoothing > 0                                # training loss is the smoothed one
    batch = _seq2seq_batch()
    outs = []
    for model in (plain, fused):
        out = model.train().loss(batch)
        out.loss.backward()
        outs.append(out)
    assert outs[1].logits is None
    torch.testing.assert_close(outs[1].loss, outs[0].loss, rtol=1e-5, atol=1e-6)
    for key in ("nll_sum", "tokens", "examples"):
        torch.testing.assert_close(outs[1].stats[key], outs[0].stats[key], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1].weight, outs[0].weight)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():                                        # evaluation: no smoothing, same NLL
        evals = [m.eval().loss(batch) for m in (plain, fused)]
    torch.testing.assert_close(evals[1].loss, evals[0].loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(evals[1].stats["nll_sum"], evals[0].stats["nll_sum"], rtol=1e-5, atol=1e-5)


def test_encoder_decoders_offer_the_fused_ce_formulations() -> None:
    model = Transformer(transformer_base_small().replace(hidden_size=16, num_layers=1, num_heads=2,
                                                         filter_size=32), SPEC)
    labels = {o.label: o for o in model.formulation_options()}
    assert labels["fused_ce"].changes == {"fused_ce": True}
    assert labels["fused_ce bf16"].needs_fast_bf16 and labels["fused_ce bf16"].rounding == "bf16"


def test_bert_fused_mlm_matches_the_logits_path() -> None:
    from hotloop.models.bert import BERT, BertHParams
    spec = ProblemSpec(task="pretrain", input_vocab_size=VOCAB, target_vocab_size=VOCAB, max_input_length=12,
                       max_target_length=4, pad_id=0)
    hp = BertHParams(hidden_size=16, num_layers=1, num_heads=2, filter_size=32, max_positions=16, dropout=0.0,
                     attention_dropout=0.0, max_length=12, max_predictions=4)
    plain, fused = _pair(lambda h, _: BERT(h, spec), hp)
    assert {"fused_ce", "fused_ce bf16"} <= {o.label for o in plain.formulation_options()}
    g = torch.Generator().manual_seed(1)
    targets = torch.randint(1, VOCAB, (3, 4), generator=g)
    targets[1, 2:] = 0                                                          # unused prediction slots
    batch = {"inputs": torch.randint(1, VOCAB, (3, 12), generator=g), "segment_ids": torch.zeros(3, 12).long(),
             "mlm_positions": torch.randint(1, 12, (3, 4), generator=g), "targets": targets,
             "nsp_targets": torch.tensor([0, 1, 1])}
    outs = [m.loss(batch) for m in (plain, fused)]
    for out in outs:
        out.loss.backward()
    assert outs[1].logits is None
    torch.testing.assert_close(outs[1].loss, outs[0].loss, rtol=1e-5, atol=1e-6)
    for key in ("nll_sum", "tokens", "examples", "nsp_nll_sum", "nsp_examples"):
        torch.testing.assert_close(outs[1].stats[key], outs[0].stats[key], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
