"""Mask R-CNN: matching and sampling by hand, forward/backward, predict, and a short overfit."""
from __future__ import annotations

import torch

from hotloop.models.rcnn_targets import BACKGROUND, IGNORE, match_boxes, sample_balanced, select_proposals
from hotloop.models.resnet_fpn import ResNet
from hotloop.models.mask_rcnn import MaskRCNN, mask_rcnn_tiny
from hotloop.ops import BoxCoder
from hotloop.problems.detection_shapes import DetectionShapes


def test_match_boxes_thresholds_and_low_quality():
    gt = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [0.0, 0.0, 0.0, 0.0]])  # last: padding
    cand = torch.tensor([[0.0, 0.0, 10.0, 9.0],      # IoU 0.9 with gt 0
                         [0.0, 0.0, 10.0, 5.0],      # IoU 0.5 with gt 0 -> ignore at (0.7, 0.3)
                         [22.0, 22.0, 34.0, 34.0],   # IoU 64 / 180 = 0.356 with gt 1: ignore, but gt 1's best
                         [50.0, 50.0, 60.0, 60.0]])  # no overlap -> background
    matched, iou = match_boxes(cand, gt, 0.7, 0.3, allow_low_quality=False)
    assert matched.tolist() == [0, IGNORE, IGNORE, BACKGROUND]
    matched, _ = match_boxes(cand, gt, 0.7, 0.3, allow_low_quality=True)
    assert matched.tolist() == [0, IGNORE, 1, BACKGROUND]
    assert abs(iou[2].item() - 64 / 180) < 1e-6
    matched, _ = match_boxes(cand, gt[:0], 0.7, 0.3, allow_low_quality=True)
    assert matched.tolist() == [BACKGROUND] * 4


def test_sample_balanced_counts():
    matched = torch.tensor([0] * 30 + [IGNORE] * 10 + [BACKGROUND] * 60)
    gen = torch.Generator().manual_seed(0)
    pos, neg = sample_balanced(matched, 40, 0.25, generator=gen)
    assert pos.sum().item() == 10 and neg.sum().item() == 30
    assert (matched[pos] >= 0).all() and (matched[neg] == BACKGROUND).all()
    pos, neg = sample_balanced(torch.tensor([1, BACKGROUND, BACKGROUND]), 40, 0.5)
    assert pos.tolist() == [True, False, False] and neg.tolist() == [False, True, True]


def test_select_proposals_keeps_best_non_overlapping():
    anchors = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 0.0, 11.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    obj = torch.tensor([0.9, 0.8, 0.1])
    out = select_proposals([obj], [torch.zeros(3, 4)], [anchors], BoxCoder(), 32, 32,
                           pre_nms_top_k=10, post_nms_top_k=10, nms_threshold=0.7)
    assert out.tolist() == [anchors[0].tolist(), anchors[2].tolist()]


def test_resnet50_layout():
    net = ResNet(64, (3, 4, 6, 3))
    assert net.channels == [256, 512, 1024, 2048]
    params = sum(p.numel() for p in net.parameters())
    assert 23_000_000 < params < 24_000_000          # ResNet-50 without its classifier: 23.5M


def _setup():
    hp = mask_rcnn_tiny()
    problem = DetectionShapes()
    torch.manual_seed(0)
    return hp, problem, MaskRCNN(hp, problem.spec(hp))


def test_forward_backward_and_predict():
    hp, problem, model = _setup()
    batch = next(iter(problem.reader("train", hp)))
    out = model.loss(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name in ("rpn_objectness_sum", "rpn_box_sum", "roi_class_sum", "mask_sum"):
        assert out.stats[name].item() > 0, name
    assert sum(p.grad is None for p in model.parameters()) == 0
    empty = dict(batch, labels=torch.full_like(batch["labels"], -1))   # images without objects
    assert torch.isfinite(model.loss(empty).loss)
    model.eval()
    dets = model.predict(batch["images"])
    assert len(dets) == 2
    for d in dets:
        assert d["masks"].shape == (d["boxes"].shape[0], 32, 32) and d["masks"].dtype == torch.bool


def test_overfit_few_images():
    torch.set_num_threads(1)
    hp, problem, model = _setup()
    batch = next(iter(problem.reader("train", hp)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        out = model.loss(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]
