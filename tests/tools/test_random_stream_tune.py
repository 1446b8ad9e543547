"""The tuner times bits16 dropout masks for a model with nn.Dropout and lets only check_parity's
random-stream rule judge them: a correct mask can be chosen, a mask that drops everything cannot."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import TinyTagger
from hotloop.ops import dropout as dropout_ops
from hotloop.tools import autotune, ranking
from hotloop.tools.significance import Comparison

pytestmark = pytest.mark.timeout(120)

# fp32 only, so the candidates are the same on every CPU (no bf16 where it is fast)
QUIET = dict(log=lambda line: None, max_trial_steps=3, num_batches=6, max_seconds=60.0, cache=False,
             allow_reduced_precision=False)


class DroppingTagger(TinyTagger):
    """TinyTagger with an nn.Dropout on its hidden states."""

    def __init__(self, hp, spec) -> None:
        super().__init__(hp, spec)
        self.drop = nn.Dropout(0.3)

    def forward(self, batch, state=None):
        x = self.embed(batch["inputs"])                       # [B, S, H]
        steps = batch["targets"].shape[1]
        x = nn.functional.pad(x, (0, 0, 0, max(0, steps - x.shape[1])))[:, :steps]  # [B, T, H]
        return self.out(self.drop(torch.tanh(self.mix(x)))), None   # [B, T, V]


@pytest.fixture
def every_candidate_faster(monkeypatch):
    """Time is not what these tests judge: every candidate counts as twice as fast as eager, and
    of the rules' proposals only the dropout masks are timed (the others would tie with them)."""
    monkeypatch.setattr(ranking, "compare_paired", lambda *args: Comparison(0.5, 0.5, 8))   # every trial's ratio
    rules = autotune.propose
    monkeypatch.setattr(autotune, "propose",
                        lambda *args, **kwargs: [p for p in rules(*args, **kwargs) if "dropout" in p.label])


def _tune(copy_problem, tiny_hp):
    torch.manual_seed(0)
    model = DroppingTagger(tiny_hp, copy_problem.spec(tiny_hp))
    report = autotune.tune(model, copy_problem, tiny_hp, "cpu", None, **QUIET)
    assert type(model.drop) is nn.Dropout            # the trials swapped their own copies only
    return report


def test_bits16_masks_are_proposed_timed_and_confirmed_by_the_random_stream_rule(
        copy_problem, tiny_hp, every_candidate_faster) -> None:
    report = _tune(copy_problem, tiny_hp)
    masks = [t for t in report.trials if t.strategy.dropout_masks == "bits16"]
    assert any(t.label == "dropout_masks=bits16" and t.measured for t in masks), [t.label for t in report.trials]
    assert report.strategy.dropout_masks == "bits16", [(t.label, t.parity) for t in report.trials]
    chosen = next(t for t in report.trials if t.label == report.chosen)
    assert "check_parity (random-stream rule: loss rel diff" in chosen.parity, chosen.parity


def test_a_mask_that_drops_everything_is_never_chosen(copy_problem, tiny_hp, every_candidate_faster,
                                                      monkeypatch) -> None:
    monkeypatch.setattr(dropout_ops, "dropout_mask",
                        lambda shape, p, dtype, device, generator=None: torch.zeros(shape, dtype=dtype))
    report = _tune(copy_problem, tiny_hp)
    judged = [t for t in report.trials if t.strategy.dropout_masks == "bits16" and "check_parity" in t.parity]
    assert judged and all("REJECTED by check_parity (random-stream rule" in t.parity for t in judged)
    assert report.strategy.dropout_masks == "bernoulli"
