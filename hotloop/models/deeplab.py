"""DeepLabV3+ (Chen et al., 2018) for semantic segmentation (``task="segment"``).

A ResNet backbone whose last stages trade stride for dilation (output stride
16 or 8), atrous spatial pyramid pooling (a 1x1 branch, three dilated 3x3
branches and image pooling, fused by a 1x1 conv), and the decoder: the ASPP
output upsampled to the first stage's resolution, concatenated with a 1x1
projection of that stage's (low-level) features, refined by two 3x3 convs,
classified and bilinearly upsampled to the input size.

Batches: ``inputs`` float ``[B, C, H, W]``, ``targets`` int64 ``[B, H, W]``
(classes ``0..K-1``; any other value, e.g. VOC's 255, is ignored). The loss is
the mean per-pixel cross-entropy; stats are ``nll_sum``/``tokens`` (pixels),
``examples`` and, with accuracy, ``correct`` (pixels) plus per-class
``inter_{c}`` / ``union_{c}`` pixel counts whose summed ratio gives the IoU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hparams import HParamsError
from ..problems.base import Batch, ProblemSpec
from ..problems.shapes_segmentation import ShapesHParams
from ..registry import hparams_sets, models
from .base import LossOutput, SequenceModel, count
from .resnet import ResNetBackbone, conv_bn, init_resnet

__all__ = ["DeepLabV3Plus", "DeepLabHParams", "ASPP", "segmentation_stats", "deeplabv3plus_r50",
           "deeplabv3plus_small"]


@dataclass(frozen=True)
class DeepLabHParams(ShapesHParams):
    stem: str = "imagenet"                          # "imagenet" (7x7/2 + pool) or "small" (3x3)
    stem_stride: int = 1                            # stride of the "small" stem
    stem_channels: int = 64
    backbone_blocks: tuple[int, ...] = (3, 4, 6, 3)  # ResNet-50
    backbone_width: int = 64                        # first stage's bottleneck width (doubles per stage)
    backbone_channels: int = 256                    # first stage's output channels (doubles per stage)
    output_stride: int = 16                         # 16 or 8 (relative to the first stage's stride)
    aspp_rates: tuple[int, ...] = (6, 12, 18)
    aspp_channels: int = 256
    low_level_channels: int = 48
    decoder_channels: int = 256
    zero_init_residual: bool = True


class ASPP(nn.Module):
    """1x1 conv, dilated 3x3 convs (one per rate) and image pooling, concatenated -> 1x1 conv."""

    def __init__(self, in_ch: int, out_ch: int, rates: tuple[int, ...], dropout: float) -> None:
        super().__init__()
        self.branches = nn.ModuleList([conv_bn(in_ch, out_ch, 1)] +
                                      [conv_bn(in_ch, out_ch, 3, dilation=r) for r in rates])
        self.image_pool = conv_bn(in_ch, out_ch, 1)
        self.project = nn.Sequential(conv_bn(out_ch * (len(rates) + 2), out_ch, 1), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        outs = [branch(x) for branch in self.branches]                  # each [B, out, h, w]
        pooled = self.image_pool(x.mean(dim=(2, 3), keepdim=True))     # [B, out, 1, 1]
        outs.append(pooled.expand(-1, -1, h, w))
        return self.project(torch.cat(outs, dim=1))                     # [B, out, h, w]


def segmentation_stats(logits: Tensor, targets: Tensor, *, with_accuracy: bool
                       ) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean per-pixel cross-entropy over valid pixels and summable stats.

    logits: [B, K, H, W]; targets: [B, H, W] (values outside ``0..K-1`` are ignored).
    """
    num_classes = logits.shape[1]
    valid = (targets >= 0) & (targets < num_classes)                    # [B, H, W]
    clean = torch.where(valid, targets, torch.full_like(targets, -100))
    nll = F.cross_entropy(logits.float(), clean, ignore_index=-100, reduction="sum")
    pixels = valid.sum()
    stats = {"nll_sum": nll.detach(), "tokens": pixels, "examples": count(targets.shape[0], targets)}
    if with_accuracy:
        pred = logits.argmax(dim=1)                                      # [B, H, W]
        stats["correct"] = ((pred == targets) & valid).sum()
        classes = torch.arange(num_classes, device=targets.device)      # [K]
        is_pred = (pred.unsqueeze(-1) == classes) & valid.unsqueeze(-1)  # [B, H, W, K]
        is_true = targets.unsqueeze(-1) == classes                       # [B, H, W, K]
        inter = (is_pred & is_true).sum(dim=(0, 1, 2))                   # [K]
        union = (is_pred | is_true).sum(dim=(0, 1, 2))                   # [K]
        for c in range(num_classes):
            stats[f"inter_{c}"] = inter[c]
            stats[f"union_{c}"] = union[c]
    return nll / pixels.clamp(min=1), stats


@models.register("deeplabv3plus")
class DeepLabV3Plus(SequenceModel):
    """inputs float [B, C, H, W] -> per-pixel logits [B, K, H, W]."""

    tasks = ("segment",)

    def __init__(self, hp: DeepLabHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        if not isinstance(hp, DeepLabHParams):
            raise HParamsError(f"deeplabv3plus needs DeepLabHParams (e.g. --hparams deeplabv3plus_small), "
                            f"got {type(hp).__name__}")
        stages = len(hp.backbone_blocks)
        strides, dilations = _stage_strides(hp, stages)
        self.backbone = ResNetBackbone(
            in_channels=hp.image_channels, stem=hp.stem, stem_stride=hp.stem_stride,
            stem_channels=hp.stem_channels, blocks=hp.backbone_blocks,
            widths=[hp.backbone_width * 2 ** i for i in range(stages)],
            out_channels=[hp.backbone_channels * 2 ** i for i in range(stages)],
            strides=strides, dilations=dilations)
        self.aspp = ASPP(self.backbone.out_channels[-1], hp.aspp_channels, tuple(hp.aspp_rates), hp.dropout)
        self.low_level = conv_bn(self.backbone.out_channels[0], hp.low_level_channels, 1)
        self.decoder = nn.Sequential(
            conv_bn(hp.aspp_channels + hp.low_level_channels, hp.decoder_channels, 3),
            conv_bn(hp.decoder_channels, hp.decoder_channels, 3))
        self.top = nn.Conv2d(hp.decoder_channels, spec.target_vocab_size, 1)
        init_resnet(self, zero_init_residual=hp.zero_init_residual)

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        x = batch["inputs"]                                             # [B, C, H, W]
        features = self.backbone(x)
        low = self.low_level(features[0])                               # [B, 48, H/s, W/s]
        high = self.aspp(features[-1])                                  # [B, 256, H/os, W/os]
        high = F.interpolate(high, size=low.shape[-2:], mode="bilinear", align_corners=False)
        y = self.top(self.decoder(torch.cat([high, low], dim=1)))       # [B, K, H/s, W/s]
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False), None

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        logits, _ = self(batch, state)
        loss, stats = segmentation_stats(logits, batch["targets"], with_accuracy=with_accuracy)
        return LossOutput(loss, stats, None, logits)


def _stage_strides(hp: DeepLabHParams, stages: int) -> tuple[list[int], list[int]]:
    """Per-stage strides and dilations: halve the resolution until ``output_stride`` is reached,
    then dilate (x2 per stage) instead."""
    first = 4 if hp.stem == "imagenet" else hp.stem_stride
    if hp.output_stride < first or hp.output_stride % first:
        raise HParamsError(f"deeplabv3plus: output_stride={hp.output_stride} must be a multiple of the "
                         f"stem's stride {first}")
    strides, dilations, stride, dilation = [1], [1], first, 1
    for _ in range(stages - 1):
        if stride * 2 <= hp.output_stride:
            stride *= 2
            strides.append(2)
            dilations.append(1)
        else:
            dilation *= 2
            strides.append(1)
            dilations.append(dilation)
    return strides, dilations


@hparams_sets.register("deeplabv3plus_r50")
def deeplabv3plus_r50() -> DeepLabHParams:
    """The published setting: ResNet-50, output stride 16, ASPP rates 6/12/18, 513 px crops,
    momentum SGD 0.007 (the paper's poly decay; cosine here). The class count comes from the
    problem (21 for PASCAL VOC, 4 for ``segment_shapes``)."""
    return DeepLabHParams(image_size=513, shape_classes=3, batch_size=8, optimizer="momentum",
                          momentum=0.9, learning_rate=0.007, weight_decay=4e-5, lr_schedule="cosine",
                          max_steps=30000, dropout=0.1)


@hparams_sets.register("deeplabv3plus_small")
def deeplabv3plus_small() -> DeepLabHParams:
    """A narrow ResNet (one bottleneck per stage, 16..128 wide) with a 3x3/2 stem for 64 px
    shape scenes: output stride 8 (8x8 at ASPP, rates 2/4/6), decoder at stride 2."""
    return DeepLabHParams(image_size=64, stem="small", stem_stride=2, stem_channels=16,
                          backbone_blocks=(1, 1, 1, 1), backbone_width=16, backbone_channels=32,
                          output_stride=8, aspp_rates=(2, 4, 6), aspp_channels=64,
                          low_level_channels=16, decoder_channels=32, batch_size=16,
                          optimizer="adam", learning_rate=2e-3, adam_beta2=0.999, adam_epsilon=1e-8,
                          lr_schedule="cosine", warmup_steps=50, max_steps=1000)
