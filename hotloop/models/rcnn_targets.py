"""Two-stage detector training targets: IoU matching, balanced sampling, RPN proposals.

All of it works within one image on the device; matching and sampling have no
host sync (random ranks replace shuffles, counts stay tensors). Proposal
selection has data-dependent sizes (NMS), so it syncs a few times per image.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..ops.boxes import BoxCoder, box_iou, clip_boxes
from ..ops.nms import batched_nms

__all__ = ["match_boxes", "sample_balanced", "select_proposals", "BACKGROUND", "IGNORE"]

BACKGROUND = -1   # match result: below the low threshold
IGNORE = -2       # match result: between the thresholds (neither positive nor negative)


def match_boxes(candidates: Tensor, gt_boxes: Tensor, high: float, low: float,
                allow_low_quality: bool) -> tuple[Tensor, Tensor]:
    """Match candidates [A, 4] to ground truth [G, 4].

    Returns ``(matched_gt [A] int64, max_iou [A])``: the index of the best ground
    truth when its IoU >= ``high``, :data:`IGNORE` in ``[low, high)``,
    :data:`BACKGROUND` below ``low``. With ``allow_low_quality`` every ground truth
    also claims the candidates that overlap it best (ties included), as in the RPN.
    """
    count = candidates.shape[0]
    if gt_boxes.shape[0] == 0:
        return (torch.full((count,), BACKGROUND, dtype=torch.long, device=candidates.device),
                candidates.new_zeros(count))
    iou = box_iou(gt_boxes, candidates)                                        # [G, A]
    max_iou, best = iou.max(dim=0)                                             # [A]
    matched = torch.where(max_iou >= high, best, torch.full_like(best, IGNORE))
    matched = torch.where(max_iou < low, torch.full_like(best, BACKGROUND), matched)
    if allow_low_quality:
        best_for_gt = iou.max(dim=1, keepdim=True).values                      # [G, 1]
        claims = (iou == best_for_gt) & (best_for_gt > 0)                      # [G, A]
        claimed = claims.any(dim=0)
        matched = torch.where(claimed, best, matched)
    return matched, max_iou


def _random_rank(mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Rank of each True entry among the True entries in a random order (False entries rank last)."""
    keys = torch.rand(mask.shape, device=mask.device, generator=generator) + (~mask).float() * 2
    order = torch.argsort(keys)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(mask.numel(), device=mask.device)
    return rank


def sample_balanced(matched: Tensor, batch_size: int, positive_fraction: float,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Pick at most ``batch_size`` entries, at most ``positive_fraction`` of them positive (matched >= 0),
    the rest background. Returns bool masks ``(positive [A], negative [A])``."""
    positive = matched >= 0
    negative = matched == BACKGROUND
    max_pos = int(batch_size * positive_fraction)
    pos_keep = positive & (_random_rank(positive, generator) < max_pos)
    num_neg = batch_size - pos_keep.sum()                                      # tensor: no sync
    neg_keep = negative & (_random_rank(negative, generator) < num_neg)
    return pos_keep, neg_keep


def select_proposals(objectness: list[Tensor], deltas: list[Tensor], anchors: list[Tensor], coder: BoxCoder,
                     height: int, width: int, *, pre_nms_top_k: int, post_nms_top_k: int,
                     nms_threshold: float, min_size: float = 1e-3) -> Tensor:
    """One image's RPN outputs per level (objectness [A_l], deltas [A_l, 4], anchors [A_l, 4])
    -> proposals [P, 4] (P <= post_nms_top_k), best first. NMS runs per level, as in FPN."""
    boxes, scores, levels = [], [], []
    for level, (obj, delta, anchor) in enumerate(zip(objectness, deltas, anchors)):
        k = min(pre_nms_top_k, obj.shape[0])
        top = torch.topk(obj, k).indices
        boxes.append(clip_boxes(coder.decode(delta[top], anchor[top]), height, width))
        scores.append(obj[top])
        levels.append(torch.full((k,), level, device=obj.device, dtype=torch.long))
    boxes_all, scores_all, levels_all = torch.cat(boxes), torch.cat(scores), torch.cat(levels)
    ok = ((boxes_all[:, 2] - boxes_all[:, 0]) > min_size) & ((boxes_all[:, 3] - boxes_all[:, 1]) > min_size)
    ok &= torch.isfinite(scores_all)
    boxes_all, scores_all, levels_all = boxes_all[ok], scores_all[ok], levels_all[ok]
    keep = batched_nms(boxes_all, scores_all, levels_all, nms_threshold)[:post_nms_top_k]
    return boxes_all[keep].detach()
