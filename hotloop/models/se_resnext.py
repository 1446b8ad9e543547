"""SE-ResNeXt (Hu et al., "Squeeze-and-Excitation Networks") for image classification.

ResNeXt bottlenecks (grouped 3x3 convs, ``cardinality`` groups of
``group_width`` channels in the first stage, doubling per stage) with a
squeeze-excitation gate (reduction ``se_reduction``) on every residual branch;
global average pool and a linear classifier. ``se_resnext50_imagenet`` is the
published SE-ResNeXt-50 (32x4d) at 224 px (27.56M parameters with 1000
classes); ``se_resnext_small`` is a narrow three-stage net for 28 px digits.
Batches: ``inputs`` float ``[B, C, H, W]`` -> logits ``[B, 1, K]`` (one "token"
per example, like :class:`~hotloop.models.conv.ConvNet`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..hparams import HParamsError
from ..problems.base import Batch, ProblemSpec
from ..problems.synthetic_images import SyntheticImageHParams
from ..registry import hparams_sets, models
from .base import SequenceModel
from .formulation import SE_FUSED_OPTION, Formulation, FormulationOption
from .resnet import ResNetBackbone, SqueezeExcitation, init_resnet

__all__ = ["SEResNeXt", "SEResNeXtHParams", "se_resnext50_imagenet", "se_resnext_small"]


@dataclass(frozen=True)
class SEResNeXtHParams(SyntheticImageHParams):
    stem: str = "imagenet"                       # "imagenet" (7x7/2 + max pool) or "small" (3x3/1)
    stem_channels: int = 64
    stage_blocks: tuple[int, ...] = (3, 4, 6, 3)  # bottlenecks per stage; stages after the first stride 2
    cardinality: int = 32                        # groups of the 3x3 convs
    group_width: int = 4                         # channels per group in the first stage (doubles per stage)
    stage_channels: int = 256                    # output channels of the first stage (doubles per stage)
    se_reduction: int = 16                       # 0 = plain ResNeXt
    zero_init_residual: bool = True


@models.register("se_resnext50")
class SEResNeXt(SequenceModel):
    """inputs float [B, C, H, W] -> logits [B, 1, num_classes]."""

    tasks = ("classify",)
    formulation_fields = ("se_backward",)

    def __init__(self, hp: SEResNeXtHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        if not isinstance(hp, SEResNeXtHParams):
            raise HParamsError(f"se_resnext50 needs SEResNeXtHParams (e.g. --hparams se_resnext_small), "
                            f"got {type(hp).__name__}")
        stages = len(hp.stage_blocks)
        self.body = ResNetBackbone(
            in_channels=hp.image_channels, stem=hp.stem, stem_channels=hp.stem_channels,
            blocks=hp.stage_blocks,
            widths=[hp.cardinality * hp.group_width * 2 ** i for i in range(stages)],
            out_channels=[hp.stage_channels * 2 ** i for i in range(stages)],
            strides=[1] + [2] * (stages - 1), groups=hp.cardinality, se_reduction=hp.se_reduction)
        self.dropout = nn.Dropout(hp.dropout)
        self.top = nn.Linear(self.body.out_channels[-1], spec.target_vocab_size)
        init_resnet(self.body, zero_init_residual=hp.zero_init_residual)

    def use_formulation(self, formulation: Formulation) -> None:
        """Also hand ``se_backward`` to every squeeze-excitation gate."""
        super().use_formulation(formulation)
        for module in self.modules():
            if isinstance(module, SqueezeExcitation):
                module.se_backward = formulation.se_backward

    def formulation_options(self) -> list[FormulationOption]:
        """The squeeze-excitation backward of fewer map passes, where there are gates."""
        return [SE_FUSED_OPTION] if self.hp.se_reduction > 0 else []

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        features = self.body(batch["inputs"])[-1]           # [B, C_last, h, w]
        pooled = self.dropout(features.mean(dim=(2, 3)))    # [B, C_last]
        return self.top(pooled).unsqueeze(1), None          # [B, 1, K]


@hparams_sets.register("se_resnext50_imagenet")
def se_resnext50_imagenet() -> SEResNeXtHParams:
    """SE-ResNeXt-50 32x4d at 224 px, 1000 classes; momentum SGD, weight decay 1e-4, label
    smoothing 0.1, cosine decay. The rate 0.1 is the usual one for batch 256: scale it with
    ``batch_size`` (32 here, a single-device batch)."""
    return SEResNeXtHParams(image_channels=3, image_size=224, num_classes=1000, batch_size=32,
                            optimizer="momentum", momentum=0.9, learning_rate=0.1, weight_decay=1e-4,
                            lr_schedule="cosine", max_epochs=120, label_smoothing=0.1)


@hparams_sets.register("se_resnext_small")
def se_resnext_small() -> SEResNeXtHParams:
    """Three stages (28 -> 14 -> 7 px), 8 groups of 4 channels, SE r=16, for 1x28x28 digits
    (``image_mnist``) on a small CPU: 0.27M parameters."""
    return SEResNeXtHParams(image_channels=1, image_size=28, num_classes=10, stem="small",
                            stem_channels=32, stage_blocks=(1, 2, 2), cardinality=8, group_width=4,
                            stage_channels=64, batch_size=64, optimizer="adam", learning_rate=2e-3,
                            adam_beta2=0.999, adam_epsilon=1e-8, lr_schedule="cosine", warmup_steps=50,
                            max_steps=1500)
