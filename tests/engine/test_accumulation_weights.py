"""Token-weighted gradient accumulation on generated data (no downloads) with UNEQUAL token counts.

Two micro-batches with different numbers of non-pad target tokens, accumulated by
``build_step``, must give the update of one batch of their concatenation (padded to
a common width). Weighting each micro-batch's mean loss equally (the mean of the
means) gives a measurably different update, which the test checks too, so that a
change to :func:`hotloop.engine.step.weighted_loss_fn` or to the division by the
summed weights cannot pass.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_hp
from hotloop.engine import Strategy, build_step
from hotloop.problems.algorithmic import Reverse
from hotloop.problems.base import PAD_ID
from hotloop.registry import models
from hotloop.compose.build import build_model

pytestmark = pytest.mark.timeout(120)

# plain SGD with lr 1: an update is minus the gradient (Adam would amplify rounding)
HP = tiny_hp("min_length=1,train_length=8,batch_size=4,optimizer=sgd,learning_rate=1.0,"
             "lr_schedule=constant,warmup_steps=0,max_grad_norm=0,dropout=0,label_smoothing=0")


def _tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["targets"] != PAD_ID).sum())


def _unequal_pair() -> list[dict[str, torch.Tensor]]:
    """The generated batches with the fewest and the most target tokens (same number of rows)."""
    reader = Reverse().reader("train", HP, shuffle=False)
    batches = sorted((b for _, b in zip(range(12), reader)), key=_tokens)
    small, large = batches[0], batches[-1]
    assert _tokens(large) >= 1.5 * _tokens(small)         # clearly unequal token counts
    return [small, large]


def _concatenated(micro: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    width = {k: max(b[k].shape[1] for b in micro) for k in ("inputs", "targets")}
    return {k: torch.cat([F.pad(b[k], (0, width[k] - b[k].shape[1]), value=PAD_ID) for b in micro])
            for k in ("inputs", "targets")}


def _update(micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """The flattened parameter change of one optimizer step over ``micro`` from the seed-0 model."""
    torch.manual_seed(0)
    model = build_model(models.get("transformer"), HP, Reverse().spec(HP))
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    result = build_step(model, HP, Strategy(fused_optimizer=False, prefetch=0)).step([dict(b) for b in micro])
    assert int(result.stats["tokens"]) == sum(_tokens(b) for b in micro)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - before


def test_accumulated_unequal_token_counts_equal_one_big_batch():
    micro = _unequal_pair()
    accumulated = _update(micro)
    big = _update([_concatenated(micro)])
    scale = big.abs().max().item()
    assert scale > 1e-3                                     # the step really moved the weights
    torch.testing.assert_close(accumulated, big, rtol=0, atol=1e-5 * scale)
    # the case discriminates: the mean of the per-micro-batch means is far from the big batch
    equal_weights = (_update(micro[:1]) + _update(micro[1:])) / 2
    assert (equal_weights - big).abs().max().item() > 100 * 1e-5 * scale
