"""``Strategy.dropout_masks`` for any model: every ``nn.Dropout`` draws the Strategy's masks.

:func:`use_dropout_masks` (called by ``build_step``) replaces each ``nn.Dropout``
module of the model (exactly that type, with ``p > 0``; shared modules once) by a
:class:`MaskedDropout`, a subclass with the same ``p`` and ``inplace`` whose
masks come from :func:`hotloop.ops.dropout.dropout` with the Strategy's
formulation (``"bits16"``: 16-bit integer draws; ``"bernoulli"``: ``F.dropout``,
bitwise ``nn.Dropout``). Dropout holds no state, so ``state_dict`` keys,
``named_parameters`` and checkpoints are unchanged; in eval mode the module
returns its input as ``nn.Dropout`` does. Building again sets the formulation of
the modules already replaced (nothing is wrapped twice).

Covered: a model's own ``nn.Dropout`` modules and those of
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` (``dropout``,
``dropout1`` .. ``dropout3``). Not covered: dropout drawn inside a function
(``F.dropout``, the attention-weight dropout of ``nn.MultiheadAttention`` inside
``F.multi_head_attention_forward``, ``F.scaled_dot_product_attention``'s
``dropout_p``), which stays Bernoulli unless the model reads ``dropout_masks``
itself (``formulation_fields``: BERT's attention, the LSTM LM); ``nn.Dropout``
subclasses and channel dropout (``nn.Dropout2d``...), which keep their own.
"""
from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from ..models.formulation import BITS16_OPTION, FormulationOption, sites_text
from ..ops.dropout import check_dropout_masks, dropout

__all__ = ["MaskedDropout", "use_dropout_masks", "dropout_sites", "has_dropout", "dropout_option",
           "with_dropout_option"]


class MaskedDropout(nn.Dropout):
    """``nn.Dropout`` whose masks follow ``masks`` ("bernoulli" | "bits16"); same ``p``, no state.

    ``inplace`` is honoured for ``bernoulli`` (``F.dropout``); ``bits16`` returns a new tensor
    (the same values an in-place multiply would leave)."""

    def __init__(self, p: float = 0.5, inplace: bool = False, masks: str = "bits16") -> None:
        super().__init__(p, inplace)
        check_dropout_masks(masks)
        self.masks = masks

    def forward(self, x: Tensor) -> Tensor:
        if self.masks == "bernoulli":
            return super().forward(x)
        return dropout(x, self.p, self.training, self.masks)                       # shape of x

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, masks={self.masks}"


def _plain_dropouts(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) for every ``nn.Dropout`` (exact type, p > 0) or MaskedDropout,
    each place a shared module sits."""
    return [(parent, name, child) for _, parent in model.named_modules(remove_duplicate=False)
            for name, child in parent.named_children()
            if (type(child) is nn.Dropout and child.p > 0) or isinstance(child, MaskedDropout)]


def dropout_sites(model: nn.Module) -> int:
    """How many distinct ``nn.Dropout`` modules with ``p > 0`` ``model`` holds (replaced ones included)."""
    return len({id(child) for _, _, child in _plain_dropouts(model)})


def has_dropout(model: nn.Module) -> bool:
    """Whether some ``nn.Dropout`` module of ``model`` drops (``p > 0``)."""
    return dropout_sites(model) > 0


def use_dropout_masks(model: nn.Module, masks: str) -> list[str]:
    """Make every ``nn.Dropout`` (p > 0) of ``model`` draw ``masks``; the step's report lines.

    With ``"bernoulli"`` a model never built with other masks is left untouched."""
    check_dropout_masks(masks)
    sites = _plain_dropouts(model)
    if masks == "bernoulli" and not any(isinstance(child, MaskedDropout) for _, _, child in sites):
        return []
    replaced: dict[int, MaskedDropout] = {}
    for parent, name, child in sites:
        if isinstance(child, MaskedDropout):
            child.masks = masks
            replaced[id(child)] = child
            continue
        swap = replaced.get(id(child))
        if swap is None:
            swap = replaced[id(child)] = MaskedDropout(child.p, child.inplace, masks)
            swap.train(child.training)
        setattr(parent, name, swap)
    return [f"dropout masks: {masks} in {sites_text(len(replaced), 'nn.Dropout')}"] if masks != "bernoulli" else []


def dropout_option(model: nn.Module) -> FormulationOption | None:
    """:data:`BITS16_OPTION` for a model with an ``nn.Dropout`` that drops (else None)."""
    sites = dropout_sites(model)
    if not sites:
        return None
    return dataclasses.replace(BITS16_OPTION, changes=dict(BITS16_OPTION.changes),
                               why=f"{BITS16_OPTION.why} in {sites_text(sites, 'nn.Dropout')}")


def with_dropout_option(options: list[FormulationOption], model: nn.Module) -> list[FormulationOption]:
    """``options`` (a model's own), plus :func:`dropout_option` unless one of them sets ``dropout_masks``."""
    engine = dropout_option(model)
    if engine is None or any("dropout_masks" in o.changes for o in options):
        return options
    return options + [engine]
