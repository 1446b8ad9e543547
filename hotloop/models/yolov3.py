"""YOLOv3: a Darknet-53 backbone and three detection scales (strides 8, 16, 32).

Darknet-53: a 3x3 stem then five stages, each a stride-2 3x3 conv followed by
``darknet_depths[i]`` residual blocks (1x1 halve, 3x3 restore); every conv is
conv + batch norm + LeakyReLU(0.1). ``darknet_width`` (32 in the paper) sets
the stem width; stage ``i`` has ``darknet_width * 2**(i+1)`` channels. The
head runs five alternating 1x1/3x3 convs on the deepest map, predicts, then
upsamples and concatenates with the next shallower stage (a small FPN), twice.

Each scale predicts ``A x (4 + 1 + K)`` values per cell; the loss is in
:mod:`hotloop.models.yolo_loss`. With ``multiscale_sizes`` set, each
training batch is resized to a size drawn from it (boxes scaled alike).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .detection_postprocess import select_detections
from .yolo_loss import YoloScale, scale_grid, yolo_loss
from ..hparams import HParams
from ..ops.boxes import yolo_decode
from ..problems.base import Batch, ProblemSpec
from ..problems.detection_shapes import DetectionShapesHParams
from ..registry import hparams_sets, models
from .base import LossOutput, SequenceModel, count

__all__ = ["YoloV3", "YoloV3HParams", "yolov3_base", "yolov3_tiny", "yolov3_shapes"]

COCO_ANCHORS = (10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326)
STRIDES = (8, 16, 32)


@dataclass(frozen=True)
class YoloV3HParams(DetectionShapesHParams):
    darknet_width: int = 32
    darknet_depths: tuple[int, ...] = (1, 2, 8, 8, 4)
    anchors: tuple[float, ...] = COCO_ANCHORS     # 9 (w, h) pairs in pixels, small to large
    ignore_threshold: float = 0.5
    multiscale_sizes: tuple[int, ...] = ()        # e.g. (320, 352, ..., 608); multiples of 32
    score_threshold: float = 0.01                 # predict(): drop detections scoring below
    nms_threshold: float = 0.5
    max_detections: int = 100


class ConvBN(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(cout), nn.LeakyReLU(0.1, inplace=True))


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(ConvBN(channels, channels // 2, 1), ConvBN(channels // 2, channels, 3))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class Darknet53(nn.Module):
    """images [B, 3, H, W] -> feature maps at strides 8, 16, 32."""

    def __init__(self, width: int, depths: tuple[int, ...]) -> None:
        super().__init__()
        if len(depths) != 5:
            raise ValueError(f"yolov3: darknet_depths needs 5 stages, got {depths}")
        self.stem = ConvBN(3, width, 3)
        stages, cin = [], width
        for i, depth in enumerate(depths):
            cout = width * 2 ** (i + 1)
            stages.append(nn.Sequential(ConvBN(cin, cout, 3, 2), *[Residual(cout) for _ in range(depth)]))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.channels = [width * 2 ** (i + 1) for i in (2, 3, 4)]

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.stem(x)
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats[2:]                                                      # strides 8, 16, 32


def _five_convs(cin: int, mid: int) -> nn.Sequential:
    return nn.Sequential(ConvBN(cin, mid, 1), ConvBN(mid, mid * 2, 3), ConvBN(mid * 2, mid, 1),
                         ConvBN(mid, mid * 2, 3), ConvBN(mid * 2, mid, 1))


@models.register("yolov3")
class YoloV3(SequenceModel):
    """batch ``images`` [B, 3, H, W] -> per-scale raw outputs [B, A, H_s, W_s, 5 + K]."""

    tasks = ("detect",)

    def __init__(self, hp: HParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        hp = hp if isinstance(hp, YoloV3HParams) else YoloV3HParams()
        self.yhp = hp
        if len(hp.anchors) != 18:
            raise ValueError(f"yolov3: anchors needs 9 (w, h) pairs (18 numbers), got {len(hp.anchors)}")
        pairs = [(float(hp.anchors[2 * i]), float(hp.anchors[2 * i + 1])) for i in range(9)]
        self.scales = [YoloScale(s, tuple(pairs[3 * i:3 * i + 3])) for i, s in enumerate(STRIDES)]
        self.num_classes = spec.target_vocab_size
        outs = 3 * (5 + self.num_classes)
        self.backbone = Darknet53(hp.darknet_width, tuple(hp.darknet_depths))
        c3, c4, c5 = self.backbone.channels
        self.neck5 = _five_convs(c5, c5 // 2)
        self.lateral5 = ConvBN(c5 // 2, c4 // 2, 1)
        self.neck4 = _five_convs(c4 + c4 // 2, c4 // 2)
        self.lateral4 = ConvBN(c4 // 2, c3 // 2, 1)
        self.neck3 = _five_convs(c3 + c3 // 2, c3 // 2)
        self.heads = nn.ModuleList(nn.Sequential(ConvBN(c // 2, c, 3), nn.Conv2d(c, outs, 1)) for c in (c3, c4, c5))
        for head in self.heads:                                               # objectness prior p = 0.01
            bias = head[-1].bias.view(3, -1)
            nn.init.zeros_(bias)
            nn.init.constant_(bias[:, 4], -4.6)
        self._rng = torch.Generator().manual_seed(hp.seed)

    def forward(self, batch: Batch, state: Any = None) -> tuple[list[Tensor], Any]:
        c3, c4, c5 = self.backbone(batch["images"])
        p5 = self.neck5(c5)
        p4 = self.neck4(torch.cat((F.interpolate(self.lateral5(p5), scale_factor=2.0), c4), 1))
        p3 = self.neck3(torch.cat((F.interpolate(self.lateral4(p4), scale_factor=2.0), c3), 1))
        outputs = []
        for head, p in zip(self.heads, (p3, p4, p5)):
            raw = head(p)                                                     # [B, A*(5+K), H, W]
            b, _, h, w = raw.shape
            outputs.append(raw.view(b, 3, -1, h, w).permute(0, 1, 3, 4, 2))  # [B, A, H, W, 5+K]
        return outputs, state

    def get_extra_state(self) -> Tensor:
        """The multi-scale size stream (a CPU generator's state): checkpoints carry it, so a resumed
        run draws the sizes the uninterrupted run would have drawn."""
        return self._rng.get_state()

    def set_extra_state(self, state: Tensor) -> None:
        self._rng.set_state(state)

    def _maybe_rescale(self, batch: Batch) -> Batch:
        sizes = tuple(self.yhp.multiscale_sizes)
        if not (self.training and sizes):
            return batch
        size = sizes[int(torch.randint(len(sizes), (1,), generator=self._rng))]   # CPU draw, no device sync
        images = batch["images"]
        factor = size / images.shape[-1]
        resized = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
        return dict(batch, images=resized, boxes=batch["boxes"] * factor)

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        batch = self._maybe_rescale(batch)
        outputs, _ = self(batch)
        size = tuple(batch["images"].shape[-2:])
        with torch.autocast(batch["images"].device.type, enabled=False):   # the loss in fp32 under bf16/fp16
            parts = yolo_loss([o.float() for o in outputs], self.scales, batch["boxes"], batch["labels"], size,
                              self.num_classes, self.yhp.ignore_threshold)
        examples = count(batch["images"].shape[0], batch["labels"])
        total_sum = (parts.objectness + parts.box + parts.classification).detach()
        stats = {"nll_sum": total_sum, "tokens": examples, "examples": examples,
                 "objectness_sum": parts.objectness.detach(), "box_sum": parts.box.detach(),
                 "class_sum": parts.classification.detach(), "positives": parts.positives.detach()}
        return LossOutput(parts.total, stats, state)

    @torch.no_grad()
    def predict(self, images: Tensor) -> list[dict[str, Tensor]]:
        """images [B, 3, H, W] -> per image ``boxes`` [K, 4] xyxy, ``scores`` [K], ``labels`` [K]."""
        outputs, _ = self({"images": images})
        boxes, scores = [], []
        for out, scale in zip(outputs, self.scales):
            out = out.float()
            anchors = torch.tensor(scale.anchors, device=out.device, dtype=out.dtype)
            grid, anchor_wh = scale_grid(out.shape[2], out.shape[3], anchors)
            decoded = yolo_decode(out[..., :4], grid, anchor_wh, scale.stride)         # [B, A, H, W, 4]
            prob = torch.sigmoid(out[..., 4:5]) * torch.sigmoid(out[..., 5:])          # [B, A, H, W, K]
            boxes.append(decoded.reshape(out.shape[0], -1, 4))
            scores.append(prob.reshape(out.shape[0], -1, self.num_classes))
        height, width = images.shape[-2:]
        return select_detections(torch.cat(boxes, 1), torch.cat(scores, 1), height, width,
                                 score_threshold=self.yhp.score_threshold, nms_threshold=self.yhp.nms_threshold,
                                 max_detections=self.yhp.max_detections)


@hparams_sets.register("yolov3_base")
def yolov3_base() -> YoloV3HParams:
    """The paper's model: Darknet-53 at full width, 416 px, COCO anchors, multi-scale 320..608."""
    return YoloV3HParams(image_size=416, batch_size=16, optimizer="momentum", learning_rate=1e-3,
                         momentum=0.9, weight_decay=5e-4, max_objects=50, num_classes=5, min_object_size=16,
                         multiscale_sizes=tuple(range(320, 609, 32)), max_steps=50000)


@hparams_sets.register("yolov3_shapes")
def yolov3_shapes() -> YoloV3HParams:
    """A narrow Darknet-53 (width 8, depths 1,1,2,2,1) on 64 px shape scenes."""
    return YoloV3HParams(image_size=64, batch_size=16, darknet_width=8, darknet_depths=(1, 1, 2, 2, 1),
                         anchors=(6, 6, 9, 9, 12, 12, 15, 15, 19, 19, 23, 23, 27, 27, 32, 32, 40, 40),
                         optimizer="adam", learning_rate=2e-3, adam_beta2=0.999, adam_epsilon=1e-8,
                         max_steps=3000, eval_examples=256)


@hparams_sets.register("yolov3_tiny")
def yolov3_tiny() -> YoloV3HParams:
    """A CPU smoke-test size: width 4, one block per stage, 32 px images."""
    return replace(yolov3_shapes(), image_size=32, min_object_size=6, darknet_width=4,
                   darknet_depths=(1, 1, 1, 1, 1), batch_size=4, max_steps=50,
                   anchors=(4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14, 16, 16, 20, 20, 24, 24))
