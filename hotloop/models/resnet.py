"""Shared ResNet building blocks: conv-BN-ReLU, squeeze-excitation, bottlenecks, a staged backbone.

The bottleneck is the "v1.5" form (the stride sits on the 3x3 conv) with
optional grouped 3x3 convolutions (ResNeXt), an optional squeeze-excitation
gate on the residual branch (SENet) and optional dilation (atrous ResNets for
DeepLab). :class:`ResNetBackbone` returns the feature map of every stage so
heads can tap low-level features.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from ..hparams import HParamsError
from ..ops.squeeze_excite import squeeze_excite

__all__ = ["conv_bn", "SqueezeExcitation", "Bottleneck", "ResNetBackbone", "init_resnet",
           "count_parameters"]


def conv_bn(in_ch: int, out_ch: int, kernel: int, *, stride: int = 1, dilation: int = 1,
            groups: int = 1, relu: bool = True) -> nn.Sequential:
    """``kernel x kernel`` conv (no bias, "same" padding) -> BatchNorm -> optional ReLU."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=dilation * (kernel - 1) // 2,
                  dilation=dilation, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """Channel gate: global average pool -> FC(C/r) -> ReLU -> FC(C) -> sigmoid, times the input.
    ``se_backward`` (the formulation field, set by the model) chooses how its backward runs
    (:mod:`hotloop.ops.squeeze_excite`)."""

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.reduce = nn.Conv2d(channels, hidden, 1)   # 1x1 convs act as the two FC layers
        self.expand = nn.Conv2d(hidden, channels, 1)
        self.se_backward = "aten"

    def forward(self, x: Tensor) -> Tensor:            # [B, C, H, W] -> [B, C, H, W]
        return squeeze_excite(x, self.reduce, self.expand, self.se_backward)


class Bottleneck(nn.Module):
    """1x1 (width) -> 3x3 (width, groups, stride, dilation) -> 1x1 (out) [-> SE] + shortcut -> ReLU."""

    def __init__(self, in_ch: int, width: int, out_ch: int, *, stride: int = 1, dilation: int = 1,
                 groups: int = 1, se_reduction: int = 0) -> None:
        super().__init__()
        self.reduce = conv_bn(in_ch, width, 1)
        self.spatial = conv_bn(width, width, 3, stride=stride, dilation=dilation, groups=groups)
        self.expand = conv_bn(width, out_ch, 1, relu=False)
        self.gate = SqueezeExcitation(out_ch, se_reduction) if se_reduction > 0 else nn.Identity()
        self.shortcut = (conv_bn(in_ch, out_ch, 1, stride=stride, relu=False)
                         if stride != 1 or in_ch != out_ch else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        y = self.gate(self.expand(self.spatial(self.reduce(x))))   # [B, out, H/s, W/s]
        return torch.relu(y + self.shortcut(x))


class ResNetBackbone(nn.Module):
    """Stem, then stages of bottlenecks; ``forward`` returns every stage's output.

    ``stem="imagenet"``: 7x7/2 conv + 3x3/2 max pool (stride 4); ``"small"``: one
    3x3 conv of stride ``stem_stride`` (for 28-64 px images). Stage ``i`` has
    ``blocks[i]`` bottlenecks of inner width ``widths[i]`` and output
    ``out_channels[i]``; its first block has stride ``strides[i]``.
    ``dilations[i] > 1`` keeps the resolution and dilates the 3x3 convs instead
    (the first block uses half the dilation, as in DeepLab).
    """

    def __init__(self, *, in_channels: int, stem: str, stem_channels: int, blocks: Sequence[int],
                 widths: Sequence[int], out_channels: Sequence[int], strides: Sequence[int],
                 dilations: Sequence[int] | None = None, groups: int = 1, se_reduction: int = 0,
                 stem_stride: int = 1) -> None:
        super().__init__()
        dilations = tuple(dilations or (1,) * len(blocks))
        if not (len(blocks) == len(widths) == len(out_channels) == len(strides) == len(dilations)):
            raise HParamsError("resnet: blocks, widths, out_channels, strides and dilations need one "
                             f"entry per stage, got {blocks}, {widths}, {out_channels}, {strides}, "
                             f"{dilations}")
        if stem == "imagenet":
            self.stem = nn.Sequential(conv_bn(in_channels, stem_channels, 7, stride=2),
                                      nn.MaxPool2d(3, stride=2, padding=1))
        elif stem == "small":
            self.stem = conv_bn(in_channels, stem_channels, 3, stride=stem_stride)
        else:
            raise HParamsError(f"resnet: unknown stem {stem!r}; use 'imagenet' or 'small'")
        stages: list[nn.Module] = []
        in_ch = stem_channels
        for n, width, out_ch, stride, dilation in zip(blocks, widths, out_channels, strides, dilations):
            first_dilation = max(1, dilation // 2)
            layers = [Bottleneck(in_ch, width, out_ch, stride=stride if dilation == 1 else 1,
                                 dilation=first_dilation, groups=groups, se_reduction=se_reduction)]
            layers += [Bottleneck(out_ch, width, out_ch, dilation=dilation, groups=groups,
                                  se_reduction=se_reduction) for _ in range(n - 1)]
            stages.append(nn.Sequential(*layers))
            in_ch = out_ch
        self.stages = nn.ModuleList(stages)
        self.out_channels = tuple(out_channels)

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.stem(x)                 # [B, stem, H/s, W/s]: s = 4 (imagenet) or stem_stride (small)
        features = []
        for stage in self.stages:
            x = stage(x)                 # [B, out_i, H_i, W_i]
            features.append(x)
        return features


def init_resnet(module: nn.Module, *, zero_init_residual: bool = True) -> None:
    """He (fan-out) init for convs, BN to identity; with ``zero_init_residual`` the last BN of
    every bottleneck starts at zero so each block starts as the identity (Goyal et al.)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if zero_init_residual:
        for m in module.modules():
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.expand[1].weight)


def count_parameters(build: Callable[[], nn.Module]) -> int:
    """Parameters of the module ``build()`` makes, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters())
