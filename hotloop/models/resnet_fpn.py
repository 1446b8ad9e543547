"""ResNet (bottleneck) backbone with a Feature Pyramid Network, for two-stage detectors.

ResNet-50 is ``depths=(3, 4, 6, 3)``, ``width=64``: a 7x7 stride-2 stem and a
3x3 stride-2 max pool, then four stages of bottleneck blocks (1x1 reduce,
3x3, 1x1 expand x4, projection shortcut on the first block of a stage; the
stride sits on the 3x3 conv). Stage outputs C2..C5 have strides 4..32.

FPN: 1x1 lateral convs to ``channels``, a top-down path (nearest 2x
upsampling + add) and 3x3 output convs give P2..P5; P6 (for the RPN only) is
P5 max-pooled with stride 2.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Bottleneck", "ResNet", "FPN", "FPN_STRIDES"]

FPN_STRIDES = (4, 8, 16, 32, 64)   # P2..P6


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())
        nn.init.zeros_(self.body[-1].weight)           # each block starts as the identity

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """images [B, 3, H, W] -> [C2, C3, C4, C5] (strides 4, 8, 16, 32)."""

    def __init__(self, width: int = 64, depths: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        if len(depths) != 4:
            raise ValueError(f"mask_rcnn: resnet_depths needs 4 stages, got {depths}")
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], width
        self.channels: list[int] = []
        for i, depth in enumerate(depths):
            stage_width = width * 2 ** i
            blocks = [Bottleneck(cin if j == 0 else stage_width * 4, stage_width, 2 if (j == 0 and i > 0) else 1)
                      for j in range(depth)]
            stages.append(nn.Sequential(*blocks))
            cin = stage_width * 4
            self.channels.append(cin)
        self.stages = nn.ModuleList(stages)

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.stem(x)
        out = []
        for stage in self.stages:
            x = stage(x)
            out.append(x)
        return out


class FPN(nn.Module):
    """[C2..C5] -> [P2..P6], each with ``channels`` channels."""

    def __init__(self, in_channels: list[int], channels: int) -> None:
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.output = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in in_channels)

    def forward(self, feats: list[Tensor]) -> list[Tensor]:
        laterals = [conv(f) for conv, f in zip(self.lateral, feats)]
        merged = [laterals[-1]]
        for lateral in reversed(laterals[:-1]):
            merged.insert(0, lateral + F.interpolate(merged[0], size=lateral.shape[-2:], mode="nearest"))
        pyramid = [conv(m) for conv, m in zip(self.output, merged)]
        pyramid.append(F.max_pool2d(pyramid[-1], 1, 2))                      # P6
        return pyramid
