"""IoU and box codings against hand-computed values and brute-force loops."""
from __future__ import annotations

import math

import torch

from hotloop.ops import BoxCoder, box_iou, clip_boxes, yolo_decode, yolo_encode

from ops_refs import iou_scalar, random_boxes




def test_box_iou_hand_values(device):
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device=device)
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 6.0, 6.0],
                      [0.0, 0.0, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0]], device=device)
    got = box_iou(a, b).cpu()
    assert torch.allclose(got, torch.tensor([[1 / 7, 1.0, 0.0, 0.5, 0.0]]), atol=1e-6)


def test_box_iou_brute_force(device):
    gen = torch.Generator().manual_seed(0)
    a, b = random_boxes(gen, 13), random_boxes(gen, 9)
    want = torch.tensor([[iou_scalar(x.tolist(), y.tolist()) for y in b] for x in a], dtype=torch.float64)
    assert torch.allclose(box_iou(a.to(device), b.to(device)).cpu(), want, atol=1e-12)


def test_box_coder_hand_values_and_roundtrip(device):
    coder = BoxCoder(weights=(10.0, 10.0, 5.0, 5.0))
    ref = torch.tensor([[0.0, 0.0, 10.0, 20.0]], device=device)
    tgt = torch.tensor([[2.0, 4.0, 22.0, 24.0]], device=device)       # centre (12, 14), size (20, 20)
    deltas = coder.encode(ref, tgt).cpu()
    want = torch.tensor([[10 * 7 / 10, 10 * 4 / 20, 5 * math.log(2.0), 5 * math.log(1.0)]])
    assert torch.allclose(deltas, want, atol=1e-5)
    gen = torch.Generator().manual_seed(1)
    r, t = random_boxes(gen, 20).to(device), random_boxes(gen, 20).to(device)
    assert torch.allclose(coder.decode(coder.encode(r, t), r), t, atol=1e-9)


def test_box_coder_clamps_huge_scale():
    coder = BoxCoder()
    out = coder.decode(torch.tensor([[0.0, 0.0, 100.0, 100.0]]), torch.tensor([[0.0, 0.0, 1.0, 1.0]]))
    assert torch.isfinite(out).all() and out[0, 2] <= 1000 / 16 + 1


def test_yolo_coding_hand_values_and_roundtrip(device):
    box = torch.tensor([[20.0, 8.0, 36.0, 40.0]], device=device)      # centre (28, 24), size (16, 32)
    cell = torch.tensor([[3, 3]], device=device)
    anchor = torch.tensor([[8.0, 16.0]], device=device)
    enc = yolo_encode(box, cell, anchor, stride=8).cpu()
    assert torch.allclose(enc, torch.tensor([[0.5, 0.0, math.log(2.0), math.log(2.0)]]), atol=1e-6)
    raw = torch.cat((torch.logit(enc[:, :2].clamp(1e-6, 1 - 1e-6)), enc[:, 2:]), 1).to(device)
    assert torch.allclose(yolo_decode(raw, cell, anchor, 8).cpu(), box.cpu(), atol=1e-3)


def test_clip_boxes():
    got = clip_boxes(torch.tensor([[-3.0, 2.0, 12.0, 30.0]]), height=20, width=10)
    assert got.tolist() == [[0.0, 2.0, 10.0, 20.0]]


def test_box_iou_batched_matches_per_item():
    gen = torch.Generator().manual_seed(7)
    a = torch.stack([random_boxes(gen, 5) for _ in range(3)])          # [3, 5, 4]
    b = torch.stack([random_boxes(gen, 4) for _ in range(3)])          # [3, 4, 4]
    got = box_iou(a, b)
    assert got.shape == (3, 5, 4)
    for i in range(3):
        assert torch.equal(got[i], box_iou(a[i], b[i]))
