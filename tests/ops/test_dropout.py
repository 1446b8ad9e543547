"""bits16 dropout masks: drop rate, scale, gradient, reproducibility and errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from hotloop.ops.dropout import DropoutMaskError, dropout, dropout_mask, random_words


@pytest.mark.parametrize("p", [0.2, 0.5, 0.65])
def test_each_16_bit_lane_drops_at_the_quantised_rate(p: float) -> None:
    torch.manual_seed(0)
    n = 1 << 20
    mask = dropout_mask((n,), p, torch.float32, torch.device("cpu"))
    dropped = round(p * 65536)
    rate = dropped / 65536
    assert abs(rate - p) <= 2 ** -17
    scale = 65536 / (65536 - dropped)
    assert set(mask.unique().tolist()) == {0.0, torch.tensor(scale, dtype=torch.float32).item()}
    # the four int16 lanes of every 64-bit word: each must drop at the rate (5 sigma)
    for lane in range(4):
        lane_mask = mask[lane::4]
        sigma = math.sqrt(rate * (1 - rate) / lane_mask.numel())
        assert abs((lane_mask == 0).float().mean().item() - rate) < 5 * sigma, lane
    # expectation of x * mask is x
    assert abs(mask.double().mean().item() - 1.0) < 5 * scale * math.sqrt(rate * (1 - rate) / n)


def test_forward_and_backward_use_the_same_mask() -> None:
    torch.manual_seed(1)
    x = torch.randn(7, 5, 11, requires_grad=True)
    y = dropout(x, 0.3, True)
    grad = torch.randn_like(y)
    y.backward(grad)
    kept = y != 0                                                         # randn is never exactly 0
    scale = torch.tensor(65536 / (65536 - round(0.3 * 65536)), dtype=torch.float32)
    assert torch.equal(x.grad, torch.where(kept, grad * scale, torch.zeros(())))
    assert torch.equal(y.detach(), torch.where(kept, x.detach() * scale, torch.zeros(())))
    assert 0.2 < 1 - kept.float().mean().item() < 0.4


def test_same_seed_same_masks_and_the_stream_advances() -> None:
    x = torch.ones(4, 300)
    torch.manual_seed(5)
    first, second = dropout(x, 0.2, True), dropout(x, 0.2, True)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.2, True), first)
    assert not torch.equal(first, second)
    generator = torch.Generator().manual_seed(9)
    again = torch.Generator().manual_seed(9)
    assert torch.equal(dropout(x, 0.2, True, generator=generator), dropout(x, 0.2, True, generator=again))


def test_identity_when_not_training_or_p_zero_and_bernoulli_is_torch() -> None:
    x = torch.randn(3, 4)
    assert dropout(x, 0.5, False) is x and dropout(x, 0.0, True) is x
    torch.manual_seed(2)
    ours = dropout(x, 0.5, True, masks="bernoulli")
    torch.manual_seed(2)
    assert torch.equal(ours, torch.nn.functional.dropout(x, 0.5, True))


def test_mask_follows_the_input_dtype() -> None:
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    assert dropout(x, 0.2, True).dtype == torch.bfloat16


def test_bad_probability_and_unknown_masks_are_clear_errors() -> None:
    with pytest.raises(DropoutMaskError, match=r"in \[0, 1\)"):
        dropout(torch.ones(3), 1.0, True)
    with pytest.raises(DropoutMaskError, match="unknown dropout masks 'coin'.*bits16"):
        dropout(torch.ones(3), 0.1, True, masks="coin")


def test_the_mask_words_are_aten_full_range_draws_and_a_traced_graph_of_them_runs() -> None:
    assert torch.Tag.nondeterministic_seeded in torch.ops.hotloop.random_words.default.tags   # kept in order
    torch.manual_seed(11)
    words = random_words(9, torch.device("cpu"))
    torch.manual_seed(11)
    assert torch.equal(words, torch.empty(9, dtype=torch.int64).random_(-(1 << 63), None))

    def masked(x: torch.Tensor) -> torch.Tensor:                  # [4, 6] -> [4, 6]
        return dropout(x, 0.5, True)

    graph = make_fx(masked, tracing_mode="fake")(torch.ones(4, 6))   # builds the graph's Python code
    assert "hotloop.random_words" in graph.code
    torch.manual_seed(3)
    traced = graph(torch.ones(4, 6))
    torch.manual_seed(3)
    assert torch.equal(traced, masked(torch.ones(4, 6)))
