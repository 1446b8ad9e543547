"""Dropout whose masks cost a quarter of the random draws (the ``bits16`` masks).

``torch.nn.functional.dropout`` on CPU draws one Bernoulli sample per element
(``bernoulli_``: one generator call and a float compare each). :func:`dropout`
draws one 64-bit word per *four* elements from the same torch generator, reads
it as four 16-bit integers and keeps an element when its integer is at least
``k = round(p * 65536)``. An element is therefore dropped with probability
``k / 65536`` (within 2^-17 of ``p``) and kept ones are scaled by
``65536 / (65536 - k)``, so the expectation is exactly the input.

The mask is built once, as ``keep * scale`` in the input's dtype, and used by
both passes: forward is one multiply, backward is one multiply. Draws come from
the default (or given) torch generator, so a seeded run repeats bitwise and a
resumed run continues the same stream.

The words come from the op ``hotloop::random_words`` (:func:`random_words`), which draws them
from the default generator. A captured step (``backend="graph"``, ``torch.compile``) records
that op and draws the same words at run time: aten's own full-range draw (``random_.from``) is
an overload whose name is a Python keyword, and the FX code made of a graph holding it does not
parse.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["dropout", "dropout_mask", "random_words", "check_dropout_masks", "DROPOUT_MASKS", "DropoutMaskError"]

#: mask formulations: "bernoulli" (torch's F.dropout) or "bits16" (this module)
DROPOUT_MASKS = ("bernoulli", "bits16")
_LEVELS = 1 << 16


class DropoutMaskError(ValueError):
    """Unknown mask formulation or a drop probability outside [0, 1)."""


def check_dropout_masks(masks: str, what: str = "dropout masks") -> None:
    """Raise :class:`DropoutMaskError` naming the choices unless ``masks`` is one of them."""
    if masks not in DROPOUT_MASKS:
        raise DropoutMaskError(f"unknown {what} {masks!r}; choose one of {list(DROPOUT_MASKS)}")


def _full_range_words(count: int, device: torch.device, generator: torch.Generator | None = None) -> Tensor:
    """``count`` uniform 64-bit words [count] (int64): aten's full-range draw."""
    return torch.empty(count, dtype=torch.int64, device=device).random_(-(1 << 63), None, generator=generator)


@torch.library.custom_op("hotloop::random_words", mutates_args=(), tags=torch.Tag.nondeterministic_seeded)
def random_words(count: int, device: torch.device) -> Tensor:
    """``count`` uniform 64-bit words [count] (int64) from the default generator of ``device``."""
    return _full_range_words(count, device)


@random_words.register_fake
def _random_words_shape(count: int, device: torch.device) -> Tensor:
    return torch.empty(count, dtype=torch.int64, device=device)


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype, device: torch.device,
                 generator: torch.Generator | None = None) -> Tensor:
    """``keep * scale`` of ``shape`` in ``dtype``: 0 with probability ``round(p*65536)/65536``."""
    if not 0.0 <= p < 1.0:
        raise DropoutMaskError(f"dropout probability must be in [0, 1), got {p}")
    dropped = round(p * _LEVELS)
    numel = math.prod(shape)
    count = (numel + 3) // 4                                             # full 64-bit words
    words = (random_words(count, torch.device(device)) if generator is None
             else _full_range_words(count, device, generator))
    levels = words.view(torch.int16)[:numel].view(shape)                 # 4 x int16 per word
    keep = levels >= dropped - (_LEVELS // 2)                            # uniform over 65536 levels
    scale = _LEVELS / (_LEVELS - dropped)
    return keep.to(dtype).mul_(scale)


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: Tensor, p: float, training: bool, masks: str = "bits16",
            generator: torch.Generator | None = None) -> Tensor:
    """Dropout of ``x`` with mask formulation ``masks`` ("bernoulli": ``F.dropout``; "bits16")."""
    check_dropout_masks(masks)
    if masks == "bernoulli":
        return torch.nn.functional.dropout(x, p, training)
    if not training or p == 0.0:
        return x
    return _MaskedScale.apply(x, dropout_mask(x.shape, p, x.dtype, x.device, generator))
