"""A small conv net for image classification (``task="classify"``).

conv3x3 -> ReLU, then strided conv3x3 -> ReLU blocks, adaptive average pool to
4x4, linear classifier. No batch norm, so N ranks x B/N images compute exactly
the gradient of one process with B images (data-parallel tests rely on it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..problems.base import Batch, ProblemSpec
from ..problems.synthetic_images import SyntheticImageHParams
from ..registry import hparams_sets, models
from .base import SequenceModel

__all__ = ["ConvNet", "ConvNetHParams", "conv_net_base"]

_POOL = 4


@dataclass(frozen=True)
class ConvNetHParams(SyntheticImageHParams):
    """The conv net's block widths on top of the image problem's fields (``image_channels``...)."""

    conv_channels: tuple[int, ...] = (32, 64, 64)   # first block stride 1, the rest stride 2


@models.register("conv_net")
class ConvNet(SequenceModel):
    """inputs float [B, C, H, W] -> logits [B, 1, num_classes] (one "token" per example)."""

    tasks = ("classify",)
    hparams_class = ConvNetHParams
    hp: ConvNetHParams

    def __init__(self, hp: ConvNetHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        channels = hp.conv_channels
        if not channels:
            raise ValueError("conv_net: conv_channels must name at least one block")
        layers: list[nn.Module] = []
        in_ch = hp.image_channels
        for i, out_ch in enumerate(channels):
            layers += [nn.Conv2d(in_ch, out_ch, 3, stride=1 if i == 0 else 2, padding=1), nn.ReLU()]
            in_ch = out_ch
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(_POOL), nn.Flatten())
        self.top = nn.Linear(in_ch * _POOL * _POOL, spec.target_vocab_size)
        self.init_weights()

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        x = batch["inputs"]                                   # [B, C, H, W]
        return self.top(self.body(x)).unsqueeze(1), None      # [B, 1, K]


@hparams_sets.register("conv_net_base")
def conv_net_base() -> ConvNetHParams:
    """3x32x32 noise images, 10 classes; Adam; sized for a CPU benchmark."""
    return ConvNetHParams(batch_size=64, optimizer="adam", learning_rate=2e-3, adam_beta2=0.999,
                          adam_epsilon=1e-8, max_steps=1000)
