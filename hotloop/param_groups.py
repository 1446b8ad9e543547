"""Optimizer parameter groups from the hparams: weight decay exclusions and layer-wise LR decay.

:func:`param_groups` splits a model's trainable parameters into torch optimizer groups:

- **No weight decay on biases and norm weights** (``hp.no_decay_bias_norm``; ``None``, the
  default, means on for ``adamw`` and off for the other optimizers): parameters of normalisation
  layers (``LayerNorm``, ``BatchNorm``, ``GroupNorm``, ...) and every one-dimensional parameter
  (biases, gains) get ``weight_decay=0``; matrices, convolution kernels and embeddings keep
  ``hp.weight_decay``.
- **Layer-wise LR decay** (``hp.layerwise_lr_decay`` ``d`` < 1, as in ELECTRA/BEiT fine-tuning):
  a parameter at depth ``k`` of a model with depths ``0..K`` (the model's ``parameter_depth(name)``;
  BERT: embeddings 0, encoder layer ``i`` ``i + 1``, pooler and heads ``K``) trains with
  ``lr_scale = d ** (K - k)``, so the top keeps the base rate and each layer below gets ``d``
  times the one above.

Each group carries ``"lr_scale"`` (1.0 when there is no decay); the LR schedule sets
``group["lr"] = base_lr * multiplier * group["lr_scale"]`` every step, and the groups start
at ``hp.learning_rate * lr_scale``. ``"param_names"`` lists each group's parameter names.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from .errors import UserError
from .hparams import HParams

__all__ = ["param_groups", "decays_bias_norm", "no_decay_names", "NORM_TYPES"]

#: module types whose parameters are never decayed when the exclusion is on
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
                                           nn.modules.batchnorm._NormBase, nn.RMSNorm)


def decays_bias_norm(hp: HParams) -> bool:
    """Whether biases and norm weights are decayed (``no_decay_bias_norm`` None: all but adamw)."""
    exclude = hp.no_decay_bias_norm
    return not (hp.optimizer == "adamw" if exclude is None else exclude)


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters of norm layers and of every parameter with one dimension."""
    out = set()
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if isinstance(module, NORM_TYPES) or p.dim() <= 1:
                out.add(f"{module_name}.{name}" if module_name else name)
    return out


def _depth_scales(model: nn.Module, names: list[str], decay: float) -> dict[str, float]:
    depth_of = getattr(model, "parameter_depth", None)
    if depth_of is None:
        raise UserError(f"layerwise_lr_decay={decay:g}: model {type(model).__name__} does not say which "
                        f"layer each parameter is in (parameter_depth); use layerwise_lr_decay=1")
    depths = {name: int(depth_of(name)) for name in names}
    top = max(depths.values(), default=0)
    return {name: decay ** (top - depth) for name, depth in depths.items()}


def param_groups(model: nn.Module, hp: HParams) -> list[dict[str, Any]]:
    """The optimizer groups of ``model``'s trainable parameters (see the module docstring)."""
    decay = hp.layerwise_lr_decay
    if not 0 < decay <= 1:
        raise UserError(f"layerwise_lr_decay must be in (0, 1], got {decay:g}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names = [n for n, _ in named]
    scales = _depth_scales(model, names, decay) if decay != 1 else dict.fromkeys(names, 1.0)
    exempt = set() if decays_bias_norm(hp) or not hp.weight_decay else no_decay_names(model)
    groups: dict[tuple[float, float], dict[str, Any]] = {}
    for name, p in named:
        wd = 0.0 if name in exempt else hp.weight_decay
        key = (scales[name], wd)
        if key not in groups:
            groups[key] = {"params": [], "param_names": [], "weight_decay": wd, "lr_scale": scales[name],
                           "lr": hp.learning_rate * scales[name]}
        groups[key]["params"].append(p)
        groups[key]["param_names"].append(name)
    return sorted(groups.values(), key=lambda g: (-g["lr_scale"], -g["weight_decay"]))
