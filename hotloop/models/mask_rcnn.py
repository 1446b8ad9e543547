"""Mask R-CNN: ResNet + FPN backbone, an RPN, and RoIAlign box and mask heads.

- RPN: a shared 3x3 conv on P2..P6, per anchor an objectness logit and box
  deltas; anchors of one size per level x ``anchor_ratios``. Training samples
  ``rpn_batch_per_image`` anchors (half positive: IoU >= 0.7 or the best anchor
  of a ground truth; negative: IoU < 0.3); BCE + smooth L1 (beta 1/9).
- Box head: proposals (plus the ground truth when training) matched at IoU
  0.5, ``roi_batch_per_image`` sampled with 25% foreground; 7x7 RoIAlign on the
  FPN level of each box, two FC layers, K+1-way softmax (cross-entropy) and
  class-specific deltas (smooth L1 on foreground, weights 10, 10, 5, 5).
- Mask head: foreground RoIs, 14x14 RoIAlign, ``mask_head_convs`` 3x3 convs,
  a 2x deconv, one ``28 x 28`` sigmoid mask per class; per-pixel BCE on the
  ground-truth class's mask only (the target is the ground-truth mask
  RoIAligned to the proposal box).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .detection_postprocess import select_detections
from .rcnn_targets import match_boxes, sample_balanced, select_proposals
from .resnet_fpn import FPN, FPN_STRIDES, ResNet
from ..hparams import HParams
from ..ops.anchors import multilevel_anchors
from ..ops.boxes import BoxCoder
from ..ops.masks import paste_masks
from ..ops.roi_align import multiscale_roi_align, roi_align
from ..problems.base import Batch, ProblemSpec
from ..problems.detection_shapes import DetectionShapesHParams
from ..registry import hparams_sets, models
from .base import LossOutput, SequenceModel, count
from .formulation import FormulationOption

__all__ = ["MaskRCNN", "MaskRCNNHParams", "mask_rcnn_base", "mask_rcnn_shapes", "mask_rcnn_tiny",
           "SEPARABLE_MAX_BYTES"]

#: the separable RoIAlign holds each region's rows of its map ([K, H, C*W]); it is offered to the
#: tuner only when that fits here for every sampled region on the largest map (P2)
SEPARABLE_MAX_BYTES = 256 * 2**20


@dataclass(frozen=True)
class MaskRCNNHParams(DetectionShapesHParams):
    resnet_width: int = 64
    resnet_depths: tuple[int, ...] = (3, 4, 6, 3)
    fpn_channels: int = 256
    anchor_sizes: tuple[float, ...] = (32, 64, 128, 256, 512)     # one per level P2..P6
    anchor_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    rpn_batch_per_image: int = 256
    rpn_pre_nms_top_k: int = 2000          # per level; halved at inference
    rpn_post_nms_top_k: int = 1000         # per image
    rpn_nms_threshold: float = 0.7
    roi_batch_per_image: int = 512
    roi_positive_fraction: float = 0.25
    roi_canonical_size: float = 224.0      # FPN level 4 box size
    box_head_dim: int = 1024
    mask_head_channels: int = 256
    mask_head_convs: int = 4
    mask_roi_size: int = 14                # masks are predicted at twice this size
    score_threshold: float = 0.05
    nms_threshold: float = 0.5
    max_detections: int = 100


class RPNHead(nn.Module):
    def __init__(self, channels: int, anchors: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.objectness = nn.Conv2d(channels, anchors, 1)
        self.deltas = nn.Conv2d(channels, anchors * 4, 1)
        for layer in (self.conv, self.objectness, self.deltas):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)

    def forward(self, feats: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """-> per level objectness [B, H*W*A] and deltas [B, H*W*A, 4], ordered (y, x, anchor)."""
        objectness, deltas = [], []
        for f in feats:
            t = F.relu(self.conv(f))
            o = self.objectness(t)                                             # [B, A, H, W]
            b, a, h, w = o.shape
            objectness.append(o.permute(0, 2, 3, 1).reshape(b, -1))
            deltas.append(self.deltas(t).view(b, a, 4, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, 4))
        return objectness, deltas


@models.register("mask_rcnn")
class MaskRCNN(SequenceModel):
    """batch ``images``/``boxes``/``labels``/``masks`` -> the paper's five losses; ``predict`` -> detections."""

    tasks = ("detect",)
    formulation_fields = ("roi_align_impl",)

    def __init__(self, hp: HParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        hp = hp if isinstance(hp, MaskRCNNHParams) else MaskRCNNHParams()
        self.mhp = hp
        if len(hp.anchor_sizes) != len(FPN_STRIDES):
            raise ValueError(f"mask_rcnn: anchor_sizes needs {len(FPN_STRIDES)} sizes (P2..P6), got {hp.anchor_sizes}")
        self.num_classes = k = spec.target_vocab_size
        self.backbone = ResNet(hp.resnet_width, tuple(hp.resnet_depths))
        self.fpn = FPN(self.backbone.channels, hp.fpn_channels)
        self.rpn = RPNHead(hp.fpn_channels, len(hp.anchor_ratios))
        c, r = hp.fpn_channels, 7
        self.box_head = nn.Sequential(nn.Flatten(), nn.Linear(c * r * r, hp.box_head_dim), nn.ReLU(inplace=True),
                                      nn.Linear(hp.box_head_dim, hp.box_head_dim), nn.ReLU(inplace=True))
        self.class_score = nn.Linear(hp.box_head_dim, k + 1)                  # index k = background
        self.box_deltas = nn.Linear(hp.box_head_dim, 4 * k)
        nn.init.normal_(self.class_score.weight, std=0.01)
        nn.init.normal_(self.box_deltas.weight, std=0.001)
        nn.init.zeros_(self.class_score.bias)
        nn.init.zeros_(self.box_deltas.bias)
        layers: list[nn.Module] = []
        cin = c
        for _ in range(hp.mask_head_convs):
            layers += [nn.Conv2d(cin, hp.mask_head_channels, 3, padding=1), nn.ReLU(inplace=True)]
            cin = hp.mask_head_channels
        layers += [nn.ConvTranspose2d(cin, hp.mask_head_channels, 2, 2), nn.ReLU(inplace=True),
                   nn.Conv2d(hp.mask_head_channels, k, 1)]
        self.mask_head = nn.Sequential(*layers)
        nn.init.normal_(self.mask_head[-1].weight, std=0.001)                # mask logits start near 0
        nn.init.zeros_(self.mask_head[-1].bias)
        self.rpn_coder = BoxCoder()
        self.roi_coder = BoxCoder((10.0, 10.0, 5.0, 5.0))

    def formulation_options(self) -> list[FormulationOption]:
        """RoIAlign as two batched GEMMs (ops/roi_align_separable.py) where the maps are small
        enough for each region's map rows (:data:`SEPARABLE_MAX_BYTES`)."""
        hp = self.mhp
        side = hp.image_size // FPN_STRIDES[0]
        regions = (hp.roi_batch_per_image + hp.max_objects) * hp.batch_size
        if regions * side * side * hp.fpn_channels * 4 > SEPARABLE_MAX_BYTES:
            return []
        return [FormulationOption("roi_align separable", {"roi_align_impl": "separable"},
                                  "RoIAlign as two batched GEMMs per level (small maps)", expected_gain=0.3)]

    # ------------------------------------------------------------------ shared pieces
    def forward(self, batch: Batch, state: Any = None) -> tuple[list[Tensor], Any]:
        """images -> FPN levels P2..P6."""
        return self.fpn(self.backbone(batch["images"])), state

    def _anchors(self, feats: list[Tensor]) -> list[Tensor]:
        return multilevel_anchors([tuple(f.shape[-2:]) for f in feats], list(FPN_STRIDES),
                                  [(s,) for s in self.mhp.anchor_sizes], tuple(self.mhp.anchor_ratios),
                                  device=feats[0].device)

    def _proposals(self, objectness: list[Tensor], deltas: list[Tensor], anchors: list[Tensor],
                   image: int, size: tuple[int, int]) -> Tensor:
        hp = self.mhp
        top_k = hp.rpn_pre_nms_top_k if self.training else max(1, hp.rpn_pre_nms_top_k // 2)
        return select_proposals([o[image].detach().float() for o in objectness],
                                [d[image].detach().float() for d in deltas], anchors, self.rpn_coder, *size,
                                pre_nms_top_k=top_k, post_nms_top_k=hp.rpn_post_nms_top_k,
                                nms_threshold=hp.rpn_nms_threshold)

    def _pool(self, feats: list[Tensor], rois: Tensor, size: int) -> Tensor:
        return multiscale_roi_align(feats[:4], rois, size, list(FPN_STRIDES[:4]), 2,
                                    canonical_size=self.mhp.roi_canonical_size,
                                    formulation=self.formulation.roi_align_impl)

    # ------------------------------------------------------------------ training
    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        hp = self.mhp
        images, labels = batch["images"], batch["labels"]
        size = (images.shape[-2], images.shape[-1])
        batch_n = images.shape[0]
        valid = labels >= 0                                                    # [B, N]
        gt_boxes = batch["boxes"].float() * valid[..., None]                   # padding -> zero boxes
        feats, _ = self(batch)
        objectness, deltas = self.rpn(feats)
        anchors = self._anchors(feats)
        all_anchors = torch.cat(anchors)                                       # [A, 4]
        all_obj, all_deltas = torch.cat(objectness, 1).float(), torch.cat(deltas, 1).float()

        rpn_obj = rpn_box = all_obj.new_zeros(())
        rois, roi_labels, roi_targets, mask_rois = [], [], [], []
        for i in range(batch_n):
            matched, _ = match_boxes(all_anchors, gt_boxes[i], 0.7, 0.3, allow_low_quality=True)
            pos, neg = sample_balanced(matched, hp.rpn_batch_per_image, 0.5)
            bce = F.binary_cross_entropy_with_logits(all_obj[i], pos.float(), reduction="none")
            rpn_obj = rpn_obj + (bce * (pos | neg)).sum()
            target = self.rpn_coder.encode(all_anchors, gt_boxes[i][matched.clamp(min=0)])
            target = torch.where(pos[:, None], target, torch.zeros_like(target))   # zero boxes give inf/nan
            l1 = F.smooth_l1_loss(all_deltas[i], target, beta=1 / 9, reduction="none").sum(-1)
            rpn_box = rpn_box + (l1 * pos).sum()

            proposals = torch.cat((self._proposals(objectness, deltas, anchors, i, size), gt_boxes[i][valid[i]]))
            matched, _ = match_boxes(proposals, gt_boxes[i], 0.5, 0.5, allow_low_quality=False)
            pos, neg = sample_balanced(matched, hp.roi_batch_per_image, hp.roi_positive_fraction)
            keep = torch.nonzero(pos | neg).flatten()
            boxes, match = proposals[keep], matched[keep]
            fg = match >= 0
            gt_index = match.clamp(min=0)
            roi_labels.append(torch.where(fg, labels[i][gt_index], torch.full_like(match, self.num_classes)))
            encoded = self.roi_coder.encode(boxes, gt_boxes[i][gt_index])
            roi_targets.append(torch.where(fg[:, None], encoded, torch.zeros_like(encoded)))
            rois.append(torch.cat((torch.full_like(boxes[:, :1], i), boxes), 1))
            fg_idx = torch.nonzero(fg).flatten()
            mask_rois.append((i, boxes[fg_idx], gt_index[fg_idx]))
        norm = float(hp.rpn_batch_per_image * batch_n)
        rpn_obj, rpn_box = rpn_obj / norm, rpn_box / norm

        rois_all, cls_target, box_target = torch.cat(rois), torch.cat(roi_labels), torch.cat(roi_targets)
        head = self.box_head(self._pool(feats, rois_all, 7))
        scores, box_deltas = self.class_score(head).float(), self.box_deltas(head).float()
        roi_cls = F.cross_entropy(scores, cls_target)
        fg = cls_target < self.num_classes
        picked = box_deltas.view(-1, self.num_classes, 4)[torch.arange(len(cls_target), device=cls_target.device),
                                                          cls_target.clamp(max=self.num_classes - 1)]
        roi_box = (F.smooth_l1_loss(picked, box_target, beta=1.0, reduction="none").sum(-1) * fg).sum() \
            / max(len(cls_target), 1)
        mask_loss = self._mask_loss(feats, mask_rois, batch)

        total = rpn_obj + rpn_box + roi_cls + roi_box + mask_loss
        examples = count(batch_n, labels)
        parts = {"rpn_objectness": rpn_obj, "rpn_box": rpn_box, "roi_class": roi_cls, "roi_box": roi_box,
                 "mask": mask_loss}
        stats = {"nll_sum": total.detach() * batch_n, "tokens": examples, "examples": examples}
        stats.update({f"{name}_sum": value.detach() * batch_n for name, value in parts.items()})
        return LossOutput(total, stats, state)

    def _mask_loss(self, feats: list[Tensor], mask_rois: list[tuple[int, Tensor, Tensor]], batch: Batch) -> Tensor:
        out_size = 2 * self.mhp.mask_roi_size
        rois = torch.cat([torch.cat((torch.full_like(b[:, :1], i), b), 1) for i, b, _ in mask_rois])
        gt_index = torch.cat([g for _, _, g in mask_rois])
        if rois.shape[0] == 0:
            return sum(p.sum() for p in self.mask_head.parameters()) * 0.0
        logits = self.mask_head(self._pool(feats, rois, self.mhp.mask_roi_size)).float()  # [F, K, M, M]
        targets = []
        for i, boxes, gt in mask_rois:                                      # gt masks RoIAligned to each proposal
            gt_rois = torch.cat((gt[:, None].to(boxes.dtype), boxes), 1)
            targets.append(roi_align(batch["masks"][i][:, None].float(), gt_rois, out_size, 1.0, 2, True)[:, 0])
        target = (torch.cat(targets) >= 0.5).float()                         # [F, M, M]
        label = batch["labels"][torch.cat([torch.full_like(g, i) for i, _, g in mask_rois]), gt_index]
        chosen = logits[torch.arange(len(label), device=label.device), label]                     # [F, M, M]
        return F.binary_cross_entropy_with_logits(chosen, target)

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def predict(self, images: Tensor) -> list[dict[str, Tensor]]:
        """images [B, 3, H, W] -> per image ``boxes``, ``scores``, ``labels``, ``masks`` bool [D, H, W]."""
        hp = self.mhp
        size = (images.shape[-2], images.shape[-1])
        feats, _ = self({"images": images})
        objectness, deltas = self.rpn(feats)
        anchors = self._anchors(feats)
        results = []
        for i in range(images.shape[0]):
            proposals = self._proposals(objectness, deltas, anchors, i, size)
            rois = torch.cat((torch.full_like(proposals[:, :1], i), proposals), 1)
            head = self.box_head(self._pool(feats, rois, 7))
            probs = torch.softmax(self.class_score(head).float(), -1)[:, :self.num_classes]   # [R, K]
            d = self.box_deltas(head).float().view(-1, self.num_classes, 4)
            boxes = self.roi_coder.decode(d, proposals[:, None, :].expand_as(d))              # [R, K, 4]
            det = select_detections(boxes[None], probs[None], *size, score_threshold=hp.score_threshold,
                                    nms_threshold=hp.nms_threshold, max_detections=hp.max_detections,
                                    class_specific_boxes=True)[0]
            det_rois = torch.cat((torch.full_like(det["boxes"][:, :1], i), det["boxes"]), 1)
            if det_rois.shape[0]:
                logits = self.mask_head(self._pool(feats, det_rois, hp.mask_roi_size)).float()
                labels = det["labels"]
                probs_mask = torch.sigmoid(logits[torch.arange(len(labels), device=labels.device), labels])
            else:
                probs_mask = det["boxes"].new_zeros(0, 2 * hp.mask_roi_size, 2 * hp.mask_roi_size)
            det["masks"] = paste_masks(probs_mask, det["boxes"], *size)
            results.append(det)
        return results


@hparams_sets.register("mask_rcnn_base")
def mask_rcnn_base() -> MaskRCNNHParams:
    """The paper's ResNet-50-FPN at full width (SGD 0.02, batch 16, 800 px images)."""
    return MaskRCNNHParams(image_size=800, batch_size=16, optimizer="momentum", learning_rate=0.02,
                           momentum=0.9, weight_decay=1e-4, max_objects=50, num_classes=5, min_object_size=16,
                           max_steps=90000, warmup_steps=1000)


@hparams_sets.register("mask_rcnn_shapes")
def mask_rcnn_shapes() -> MaskRCNNHParams:
    """A narrow ResNet-50-FPN on 64 px shape scenes."""
    return MaskRCNNHParams(image_size=64, batch_size=8, resnet_width=16, resnet_depths=(1, 2, 2, 1),
                           fpn_channels=64, anchor_sizes=(8, 16, 32, 64, 128), rpn_batch_per_image=128,
                           rpn_pre_nms_top_k=600, rpn_post_nms_top_k=200, roi_batch_per_image=128,
                           roi_canonical_size=32.0, box_head_dim=256, mask_head_channels=64, mask_head_convs=2,
                           optimizer="adam", learning_rate=1e-3, adam_beta2=0.999, adam_epsilon=1e-8,
                           max_steps=3000, eval_examples=256)


@hparams_sets.register("mask_rcnn_tiny")
def mask_rcnn_tiny() -> MaskRCNNHParams:
    """A CPU smoke-test size: width 4, one block per stage, 32 px images."""
    return replace(mask_rcnn_shapes(), image_size=32, min_object_size=6, batch_size=2, resnet_width=4,
                   resnet_depths=(1, 1, 1, 1), fpn_channels=16, anchor_sizes=(4, 8, 16, 32, 64),
                   rpn_batch_per_image=64, rpn_pre_nms_top_k=200, rpn_post_nms_top_k=50, roi_batch_per_image=32,
                   roi_canonical_size=16.0, box_head_dim=32, mask_head_channels=8, mask_head_convs=1,
                   mask_roi_size=7, max_steps=50)
