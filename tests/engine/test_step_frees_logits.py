"""A training step does not hold the model's logits through backward.

``LossOutput.logits`` (for a language model ``[tokens, vocab]``, the largest activation) is for
evaluation; a step returns only the loss, statistics and state. Autograd keeps what backward
needs (log-softmax's output, not its input), so once the step drops the ``LossOutput`` the logits
are freed before backward allocates its own buffers of that size: lower peak memory, and no
fresh pages for those buffers. Checked on the eager backend for one micro-batch and for
accumulation (the weighted loss function); the graph backend replays a captured graph, where
the model's Python hook does not run, and plans its own buffers.
"""
from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hotloop.engine import Strategy, build_step
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput

pytestmark = pytest.mark.timeout(120)


class LogitsProbe(nn.Module):
    """A linear classifier whose loss returns its logits; during backward it records whether
    the logits tensor is still alive (a hook on the hidden activation runs after the logits'
    gradient is formed)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(6, 8), nn.Linear(8, 5)
        self.alive_in_backward: list[bool] = []

    def loss(self, batch: dict[str, torch.Tensor], state: object = None) -> LossOutput:
        h = torch.tanh(self.hidden(batch["x"]))                                # [B, 8]
        logits = self.out(h)                                                   # [B, 5]
        ref = weakref.ref(logits)
        h.register_hook(lambda grad: self.alive_in_backward.append(ref() is not None))
        loss = F.cross_entropy(logits, batch["y"])
        return LossOutput(loss, {"examples": torch.tensor(batch["y"].numel())}, None, logits,
                          weight=torch.tensor(float(batch["y"].numel())))


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(4, 6, generator=g), "y": torch.randint(0, 5, (4,), generator=g)}


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_logits_are_freed_before_backward(micro_batches: int) -> None:
    model = LogitsProbe()
    built = build_step(model, HParams(optimizer="sgd", learning_rate=0.1, max_grad_norm=0.0),
                       Strategy(prefetch=0))
    for step in range(2):
        result = built.step([_batch(10 * step + i) for i in range(micro_batches)])
        assert torch.isfinite(result.loss)
    assert len(model.alive_in_backward) == 2 * micro_batches
    assert not any(model.alive_in_backward), model.alive_in_backward


def test_the_model_itself_still_returns_its_logits() -> None:
    out = LogitsProbe().loss(_batch(0))
    assert out.logits is not None and out.logits.shape == (4, 5)
