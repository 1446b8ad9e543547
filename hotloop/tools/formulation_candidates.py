"""The formulation candidates the tuner times for a model: its own options, the engine's, and the clip fold.

:func:`formulation_options` gathers the model's ``formulation_options()`` and the engine's options
for the modules it has (``nn.Dropout``: :mod:`hotloop.engine.dropout_masks`; dilated and 1x1
``nn.Conv2d``: :mod:`hotloop.engine.conv_formulations`; ``nn.InstanceNorm2d``:
:mod:`hotloop.engine.norm_formulations`; ``nn.Linear`` and ``nn.MultiheadAttention``:
:mod:`hotloop.engine.linear_formulations`); :func:`clip_foldable` says whether the clip factor can
fold into the learning rate. ``tools/proposals.py`` ``formulation_proposals`` filters them by hardware.
"""
from __future__ import annotations

import torch
from torch import nn

from ..engine.clipping import clip_via_lr_unavailable
from ..engine.conv_formulations import conv_formulation_options
from ..engine.dropout_masks import with_dropout_option
from ..engine.linear_formulations import linear_gemm_options
from ..engine.norm_formulations import batch_norm_options, instance_norm_options
from ..errors import UserError
from ..hparams import HParams
from ..models.formulation import FormulationOption
from ..optim import build_optimizer

__all__ = ["formulation_options", "clip_foldable"]


def formulation_options(model: nn.Module) -> list[FormulationOption]:
    """The model's own options and the engine's for the modules it has (module doc)."""
    options = getattr(model, "formulation_options", None)
    return (with_dropout_option(list(options()) if callable(options) else [], model)
            + conv_formulation_options(model) + instance_norm_options(model) + batch_norm_options(model)
            + linear_gemm_options(model))


def clip_foldable(hp: HParams, device: torch.device) -> bool:
    """Whether the clip factor can fold into the learning rate (engine/clipping.py's conditions)."""
    if hp.max_grad_norm <= 0:
        return False
    probe = torch.nn.Parameter(torch.zeros(1))
    try:
        optimizer = build_optimizer([probe], hp, fused=False)
    except (UserError, ValueError, TypeError):   # an optimizer that cannot be built: the trials say why
        return False
    return clip_via_lr_unavailable(optimizer, device) is None
