"""Greedy and beam search: hand-checked beams, length penalty, brute force, cached == uncached."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from hotloop.decode.search import beam_search, greedy_search, length_penalty, max_target_lengths
from hotloop.problems.base import EOS_ID

from decode_fakes import PrefixState, RandomTableDecoder, TableDecoder

torch.set_num_threads(1)
A, B = 2, 3   # word ids of the fake vocabulary {0 PAD, 1 EOS, 2 a, 3 b}


def _one_sentence(max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([[5, EOS_ID]]), torch.tensor([max_len])


def test_hand_checked_beam_beats_greedy():
    # step 1: a .5, b .4, EOS .1; after a: EOS .4, a .3, b .3; after b: EOS .9, a .05, b .05.
    # greedy: a EOS (p .2). Beam 2, step 1 keeps {a, b} (EOS ranks 3rd: not finished);
    # step 2's top candidates are b EOS (.36) and a EOS (.2): both finish -> "b" wins.
    model = TableDecoder({(): {A: .5, B: .4, EOS_ID: .1}, (A,): {EOS_ID: .4, A: .3, B: .3},
                          (B,): {EOS_ID: .9, A: .05, B: .05}})
    inputs, max_len = _one_sentence(10)
    assert greedy_search(model, inputs, max_len).tolist() == [[A, EOS_ID]]
    result = beam_search(model, inputs, max_len, beam_size=2, alpha=0.0)
    assert result.tokens.tolist() == [[B, EOS_ID]]
    assert result.scores.item() == pytest.approx(math.log(.36))
    scored = beam_search(model, inputs, max_len, beam_size=2, alpha=1.0)   # same winner, penalised score
    assert scored.scores.item() == pytest.approx(math.log(.36) / (7 / 6))


def test_length_penalty_prefers_longer_with_alpha():
    # EOS at once has p .4; "a a a" (forced EOS at max length 4) has p .3, "b b b" p .27.
    model = TableDecoder({(): {EOS_ID: .4, A: .3, B: .3}, (A,): {A: 1.0}, (A, A): {A: 1.0},
                          (B,): {B: .9, EOS_ID: .1}, (B, B): {B: 1.0}})
    inputs, max_len = _one_sentence(4)
    short = beam_search(model, inputs, max_len, beam_size=2, alpha=0.0)
    assert short.tokens.tolist() == [[EOS_ID]]
    long = beam_search(model, inputs, max_len, beam_size=2, alpha=1.0)
    assert long.tokens.tolist() == [[A, A, A, EOS_ID]]
    assert long.scores.item() == pytest.approx(math.log(.3) / 1.5)
    assert length_penalty(4.0, 1.0) == pytest.approx(1.5) and length_penalty(1.0, 0.6) == pytest.approx(1.0)


def _brute_force(model: TableDecoder, max_len: int, alpha: float) -> tuple[list[int], float]:
    """The best of all sequences over {a, b} ending in EOS (forced at ``max_len``) and its score."""
    best, best_score = [], -math.inf
    for length in range(1, max_len + 1):
        for words in itertools.product([A, B], repeat=length - 1):
            seq = list(words) + [EOS_ID]
            forced = length == max_len
            logp = sum(model.logprobs(tuple(seq[:j]))[seq[j]] for j in range(length - (1 if forced else 0)))
            score = logp / length_penalty(float(length), alpha)
            if score > best_score:
                best, best_score = seq, score
    return best, best_score


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_wide_beam_equals_brute_force(alpha):
    model = RandomTableDecoder(vocab=4, seed=int(alpha * 10))
    max_len = 4
    best, best_score = _brute_force(model, max_len, alpha)
    inputs, lengths = _one_sentence(max_len)
    result = beam_search(model, inputs, lengths, beam_size=27, alpha=alpha)
    assert result.tokens[0, : len(best)].tolist() == best
    assert result.scores.item() == pytest.approx(best_score)


def test_best_hypothesis_moving_across_beam_rows_matches_brute_force(monkeypatch):
    """The cache (the fed prefix) must follow each survivor's origin beam, not its rank.

    Beam 2. Step 1 keeps rows [a, b]. Step 2's best survivor "b a" (.36) comes from row 1 and
    the second, "a a" (.33), from row 0, so the rows swap. After "b a" EOS is certain (.36);
    after "a a" it is .1. A cache reordered by rank would feed "b a" the prefix "a a" and
    "a a" the prefix "b a", and finish "a a" EOS (.33) instead of the true best "b a" EOS.
    """
    model = TableDecoder({(): {A: .6, B: .4}, (A,): {A: .55, B: .45}, (B,): {A: .9, B: .1},
                          (A, A): {EOS_ID: .1, A: .9}})
    max_len = 5
    best, best_score = _brute_force(model, max_len, 0.0)
    assert best == [B, A, EOS_ID] and best_score == pytest.approx(math.log(.36))
    reorders: list[list[int]] = []
    original = PrefixState.reorder
    monkeypatch.setattr(PrefixState, "reorder",
                        lambda self, index: reorders.append(index.tolist()) or original(self, index))
    inputs, lengths = _one_sentence(max_len)
    result = beam_search(model, inputs, lengths, beam_size=2, alpha=0.0, check_every=1)
    assert [1, 0] in reorders                       # the best path really moved from row 1 to row 0
    assert result.tokens[0].tolist() == best
    assert result.scores.item() == pytest.approx(best_score)
    # two sentences in one batch: the second sentence's rows are offset by the beam size
    both = beam_search(model, inputs.repeat(2, 1), lengths.repeat(2), beam_size=2, alpha=0.0, check_every=1)
    assert both.tokens.tolist() == [best, best]


def test_max_length_is_per_sentence_and_relative():
    inputs = torch.tensor([[4, 5, EOS_ID, 0], [4, 5, 6, EOS_ID]])
    assert max_target_lengths(inputs, extra=2).tolist() == [5, 6]
    assert max_target_lengths(inputs, extra=2, cap=5).tolist() == [5, 5]
    model = TableDecoder({}, vocab=4)
    model.table = {p: {A: 1.0} for p in [(), (A,), (A, A), (A, A, A), (A, A, A, A), (A,) * 5]}
    out = greedy_search(model, inputs, torch.tensor([2, 4]), check_every=1)
    assert out.tolist() == [[A, EOS_ID, 0, 0], [A, A, A, EOS_ID]]
    beams = beam_search(model, inputs, torch.tensor([2, 4]), beam_size=3, alpha=0.6, check_every=1)
    assert beams.tokens.tolist() == [[A, EOS_ID, 0, 0], [A, A, A, EOS_ID]]


@pytest.mark.parametrize("name,hparams", [("transformer", "transformer_base_small"),
                                          ("lstm_seq2seq", "lstm_seq2seq_multi30k")])
def test_cached_equals_uncached_and_beam1_equals_greedy(tiny_seq2seq, name, hparams):
    model = tiny_seq2seq(name, hparams)
    torch.manual_seed(1)
    inputs = torch.randint(2, 30, (4, 7))
    inputs[:, -1] = EOS_ID
    inputs[1, 4:] = 0
    inputs[1, 3] = EOS_ID
    lengths = max_target_lengths(inputs, extra=5, cap=model.max_decode_length)
    greedy = greedy_search(model, inputs, lengths)
    assert torch.equal(greedy, greedy_search(model, inputs, lengths, cached=False))
    assert greedy.shape[1] > 3   # an untrained model does not stop at once: the steps are exercised
    one = beam_search(model, inputs, lengths, beam_size=1, alpha=0.6)
    assert torch.equal(one.tokens, greedy)
    cached = beam_search(model, inputs, lengths, beam_size=4, alpha=0.6)
    uncached = beam_search(model, inputs, lengths, beam_size=4, alpha=0.6, cached=False)
    assert torch.equal(cached.tokens, uncached.tokens)
    torch.testing.assert_close(cached.scores, uncached.scores)
    # each sentence alone gives the same beam as the batch (padding and row bookkeeping)
    for row in range(inputs.shape[0]):
        alone = inputs[row: row + 1, : int((inputs[row] != 0).sum())]
        single = beam_search(model, alone, lengths[row: row + 1], beam_size=4, alpha=0.6)
        width = single.tokens.shape[1]
        assert cached.tokens[row, :width].tolist() == single.tokens[0].tolist()


def test_float32_cached_greedy_matches_uncached(tiny_seq2seq):
    model = tiny_seq2seq("transformer", "transformer_base_small", dtype=torch.float32, seed=3)
    inputs = torch.randint(2, 30, (3, 6))
    inputs[:, -1] = EOS_ID
    lengths = max_target_lengths(inputs, extra=6, cap=model.max_decode_length)
    assert torch.equal(greedy_search(model, inputs, lengths), greedy_search(model, inputs, lengths, cached=False))
