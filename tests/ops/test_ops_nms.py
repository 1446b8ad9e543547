"""Vectorised NMS against a brute-force greedy NMS on random boxes."""
from __future__ import annotations

import pytest
import torch

from hotloop.ops import batched_nms, batched_nms_mask, box_iou, nms, nms_mask

from ops_refs import greedy_nms, random_boxes


def test_nms_hand_example(device):
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10.5]],
                         dtype=torch.float32, device=device)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95], device=device)
    assert nms(boxes, scores, 0.5).tolist() == [3, 2]       # 0 and 1 overlap box 3 by > 0.5
    assert nms(boxes, scores, 0.99).tolist() == [3, 0, 1, 2]


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nms_matches_greedy(device, threshold, seed):
    gen = torch.Generator().manual_seed(seed)
    boxes = random_boxes(gen, 150, size=60.0)
    scores = torch.rand(150, generator=gen, dtype=torch.float64)
    want = greedy_nms(boxes, scores, threshold)
    got = nms(boxes.to(device), scores.to(device), threshold).cpu().tolist()
    assert got == want
    mask = nms_mask(boxes.to(device), scores.to(device), threshold).cpu()
    assert sorted(torch.nonzero(mask).flatten().tolist()) == sorted(want)


def test_nms_at_iou_exactly_the_threshold_keeps_the_box(device):
    """Suppression needs IoU > threshold: a box overlapping by exactly the threshold is kept."""
    # [0,0,3,4] and [1,0,4,4]: intersection 8, union 16 -> IoU 0.5 exactly (also in float32)
    boxes = torch.tensor([[0, 0, 3, 4], [1, 0, 4, 4], [0, 0, 3, 4.5]], dtype=torch.float32, device=device)
    scores = torch.tensor([0.9, 0.8, 0.1], device=device)
    assert box_iou(boxes[:1], boxes[1:2]).item() == 0.5
    assert nms(boxes, scores, 0.5).tolist() == [0, 1]           # box 2 overlaps box 0 by 12/13.5 > 0.5
    assert nms_mask(boxes, scores, 0.5).tolist() == [True, True, False]
    assert nms(boxes, scores, 0.49).tolist() == [0]             # just below: suppressed
    classes = torch.tensor([1, 1, 0], device=device)
    assert batched_nms(boxes, scores, classes, 0.5).tolist() == [0, 1, 2]
    assert greedy_nms(boxes.cpu(), scores.cpu(), 0.5) == [0, 1]   # the reference agrees


def test_nms_ties_and_empty(device):
    boxes = torch.tensor([[0, 0, 4, 4], [0, 0, 4, 4], [0, 0, 4, 4]], dtype=torch.float32, device=device)
    assert nms(boxes, torch.ones(3, device=device), 0.5).tolist() == [0]
    assert nms(boxes[:0], torch.ones(0, device=device), 0.5).tolist() == []


@pytest.mark.parametrize("seed", [3, 4])
def test_batched_nms_matches_per_class_greedy(device, seed):
    gen = torch.Generator().manual_seed(seed)
    boxes = random_boxes(gen, 120, size=40.0)
    scores = torch.rand(120, generator=gen, dtype=torch.float64)
    classes = torch.randint(0, 4, (120,), generator=gen)
    want = greedy_nms(boxes, scores, 0.4, classes)
    got = batched_nms(boxes.to(device), scores.to(device), classes.to(device), 0.4).cpu().tolist()
    assert got == want
    assert len(want) > len(greedy_nms(boxes, scores, 0.4))   # classes really kept more boxes
    mask = batched_nms_mask(boxes.to(device), scores.to(device), classes.to(device), 0.4).cpu()
    assert sorted(torch.nonzero(mask).flatten().tolist()) == sorted(want)
