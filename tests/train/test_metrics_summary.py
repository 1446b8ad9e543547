"""summarize(): the metrics each kind of statistic turns into."""
from __future__ import annotations

import math

import pytest

from hotloop.train.metrics import summarize


def test_token_metrics_secondary_heads_per_example_means_and_miou():
    sums = {"nll_sum": 20.0, "tokens": 10.0, "correct": 7.0, "examples": 4.0, "seq_correct": 1.0,
            "nsp_nll_sum": 2.0, "nsp_correct": 3.0, "nsp_examples": 4.0,
            "gan_sum": 8.0, "discriminator/disc_sum": 6.0, "discriminator/examples": 3.0,
            "inter_0": 5.0, "union_0": 10.0, "inter_1": 3.0, "union_1": 4.0, "inter_2": 0.0, "union_2": 0.0}
    out = summarize(sums)
    assert out["loss"] == 2.0 and out["ppl"] == pytest.approx(math.exp(2.0))
    assert out["accuracy"] == 0.7 and out["seq_accuracy"] == 0.25
    assert out["nsp_loss"] == 0.5 and out["nsp_accuracy"] == 0.75
    assert out["gan"] == 2.0 and out["discriminator/disc"] == 2.0
    assert out["miou"] == pytest.approx((0.5 + 0.75) / 2)          # class 2 is absent: not averaged
    assert out["tokens"] == 10 and out["examples"] == 4
    assert "nsp_nll" not in out and "nll" not in out
