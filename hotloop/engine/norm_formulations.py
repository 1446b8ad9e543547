"""``Strategy.instance_norm`` for any model's ``nn.InstanceNorm2d``, ``Strategy.batch_norm`` for its
``nn.BatchNorm2d``.

:func:`use_instance_norm` (called by ``build_step``) makes each eligible ``nn.InstanceNorm2d`` of
the model (exactly that type, no affine parameters, no running statistics) a
:class:`FormulatedInstanceNorm2d`: the same module and hooks, whose channels-last inputs are
normalised per :func:`hotloop.ops.instance_norm.instance_norm2d` (``"per_sample"``: no layout
copies). With ``"aten"`` in a channels-last model they stay formulated for their batch-of-one
calls, which ``F.instance_norm`` gets wrong in channels-last (:mod:`hotloop.ops.instance_norm`);
with ``"aten"`` otherwise the modules are ``nn.InstanceNorm2d`` again.

:func:`use_batch_norm` likewise makes each ``nn.BatchNorm2d`` (exactly that type) a
:class:`FormulatedBatchNorm2d` for ``"two_pass"`` (:func:`hotloop.ops.batch_norm.batch_norm2d`:
statistics of channels-last maps summed in two passes) and back for ``"aten"``. Momentum, the
cumulative average (``momentum=None``), ``num_batches_tracked`` and buffers that are not tracked
behave as in ``nn.BatchNorm2d``.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..models.formulation import (BATCH_NORM_OPTION, INSTANCE_NORM_OPTION, Formulation, FormulationOption,
                                  sites_text)
from ..ops.batch_norm import batch_norm2d
from ..ops.instance_norm import instance_norm2d

__all__ = ["FormulatedInstanceNorm2d", "use_instance_norm", "instance_norm_sites", "instance_norm_options",
           "FormulatedBatchNorm2d", "use_batch_norm", "batch_norm_sites", "batch_norm_options"]


class FormulatedInstanceNorm2d(nn.InstanceNorm2d):
    """``nn.InstanceNorm2d`` whose batched 4-D inputs are normalised per its ``impl`` (module doc)."""

    impl = "aten"

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() == 4:
            if input.shape[1] != self.num_features:     # the plain module only warns for a non-affine norm
                raise ValueError(f"expected {self.num_features} channels, got input of shape {tuple(input.shape)}")
            return instance_norm2d(input, self.eps, self.impl)
        return super().forward(input)


def _swap_class(norms: list[nn.Module], formulated_cls: type, plain_cls: type, impl: str, formulated: bool) -> None:
    """Make each of ``norms`` a ``formulated_cls`` computing per ``impl``, or (``formulated`` False)
    a ``plain_cls`` again; the class only: buffers and hooks stay the module's."""
    for norm in norms:
        if formulated:
            norm.__class__ = formulated_cls
            norm.impl = impl
        elif type(norm) is formulated_cls:
            norm.__class__ = plain_cls
            norm.__dict__.pop("impl", None)


def instance_norm_sites(model: nn.Module) -> list[nn.InstanceNorm2d]:
    """The distinct ``nn.InstanceNorm2d`` modules of ``model`` that ``instance_norm`` applies to."""
    return [m for m in model.modules() if type(m) in (nn.InstanceNorm2d, FormulatedInstanceNorm2d)
            and not m.affine and not m.track_running_stats]


def use_instance_norm(model: nn.Module, impl: str = "aten", channels_last: bool = False) -> list[str]:
    """Give ``model``'s instance norms the formulation ``impl`` (the module doc says when they stay
    ``nn.InstanceNorm2d``); the step's report lines (an unknown value: ``FormulationError``)."""
    Formulation(instance_norm=impl).check()
    sites = instance_norm_sites(model)
    formulated = impl != "aten" or channels_last
    _swap_class(sites, FormulatedInstanceNorm2d, nn.InstanceNorm2d, impl, formulated)
    if not formulated or not sites:
        return []
    modules = sites_text(len(sites), "nn.InstanceNorm2d")
    if impl == "aten":
        return [f"instance norm: aten in {modules}, batches of one as batch norm (channels-last gradients)"]
    return [f"instance norm: {impl} in {modules}"]


def instance_norm_options(model: nn.Module) -> list[FormulationOption]:
    """:data:`INSTANCE_NORM_OPTION` for a model with instance norms (their count in its reason)."""
    sites = instance_norm_sites(model)
    return [INSTANCE_NORM_OPTION.at_sites(len(sites), "nn.InstanceNorm2d")] if sites else []


class FormulatedBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose inputs are normalised per its ``impl`` (module doc)."""

    impl = "aten"

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        return batch_norm2d(input, self.running_mean if tracked else None, self.running_var if tracked else None,
                            self.weight, self.bias, use_batch_stats, factor, self.eps, self.impl)


def batch_norm_sites(model: nn.Module) -> list[nn.BatchNorm2d]:
    """The distinct ``nn.BatchNorm2d`` modules of ``model`` (exactly that type) that ``batch_norm``
    applies to."""
    return [m for m in model.modules() if type(m) in (nn.BatchNorm2d, FormulatedBatchNorm2d)]


def use_batch_norm(model: nn.Module, impl: str = "aten") -> list[str]:
    """Give ``model``'s batch norms the formulation ``impl``; the step's report lines (an unknown
    value: ``FormulationError``)."""
    Formulation(batch_norm=impl).check()
    sites = batch_norm_sites(model)
    _swap_class(sites, FormulatedBatchNorm2d, nn.BatchNorm2d, impl, impl != "aten")
    if impl == "aten" or not sites:
        return []
    return [f"batch norm: {impl} in {sites_text(len(sites), 'nn.BatchNorm2d')}"]


def batch_norm_options(model: nn.Module) -> list[FormulationOption]:
    """:data:`BATCH_NORM_OPTION` for a model with batch norms (their count in its reason)."""
    sites = batch_norm_sites(model)
    return [BATCH_NORM_OPTION.at_sites(len(sites), "nn.BatchNorm2d")] if sites else []
