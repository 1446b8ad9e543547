"""Anchors and mask pasting/cropping against hand-computed and brute-force references."""
from __future__ import annotations

import math

import torch

from hotloop.ops import cell_anchors, crop_masks, grid_anchors, multilevel_anchors, paste_masks

from ops_refs import paste_ref


def test_cell_anchors_hand_values(device):
    base = cell_anchors((8.0, 16.0), (0.5, 1.0, 2.0), device=device).cpu()
    assert base.shape == (6, 4)
    r = math.sqrt(0.5)
    assert torch.allclose(base[0], torch.tensor([-4 / r, -4 * r, 4 / r, 4 * r]))   # size 8, h/w = 0.5
    assert torch.allclose(base[4], torch.tensor([-8.0, -8.0, 8.0, 8.0]))           # size 16, square
    area = (base[:, 2] - base[:, 0]) * (base[:, 3] - base[:, 1])
    assert torch.allclose(area, torch.tensor([64.0] * 3 + [256.0] * 3))


def test_grid_anchors_order_and_offsets(device):
    base = torch.tensor([[-1.0, -1.0, 1.0, 1.0], [-2.0, -1.0, 2.0, 1.0]], device=device)
    out = grid_anchors(base, 2, 3, stride=4.0).cpu()                                  # [2*3*2, 4]
    assert out.shape == (12, 4)
    # (y=1, x=2, anchor=1): centre ((2 + .5) * 4, (1 + .5) * 4) = (10, 6)
    assert out[(1 * 3 + 2) * 2 + 1].tolist() == [8.0, 5.0, 12.0, 7.0]
    levels = multilevel_anchors([(2, 2), (1, 1)], [4, 8], [(4.0,), (8.0,)], (1.0,), offset=0.0)
    assert [a.shape[0] for a in levels] == [4, 1] and levels[1][0].tolist() == [-4.0, -4.0, 4.0, 4.0]


def test_paste_masks_matches_brute_force(device):
    gen = torch.Generator().manual_seed(0)
    masks = torch.rand(4, 5, 5, generator=gen, dtype=torch.float64)
    boxes = torch.tensor([[2.0, 3.0, 12.5, 9.0], [-3.0, -2.0, 6.0, 7.0], [8.3, 1.1, 15.9, 13.7],
                          [4.0, 4.0, 4.6, 5.5]], dtype=torch.float64)
    soft = paste_masks(masks.to(device), boxes.to(device), 14, 16, threshold=None).cpu()
    for i in range(4):
        assert torch.allclose(soft[i], paste_ref(masks[i], boxes[i], 14, 16), atol=1e-9)
    hard = paste_masks(masks.to(device), boxes.to(device), 14, 16).cpu()
    assert torch.equal(hard, soft >= 0.5)


def test_paste_full_box_square_mask():
    # a mask of all ones pasted on an integer box covers exactly the box's pixels
    out = paste_masks(torch.ones(1, 7, 7), torch.tensor([[3.0, 2.0, 9.0, 5.0]]), 8, 12)[0]
    want = torch.zeros(8, 12, dtype=torch.bool)
    want[2:5, 3:9] = True
    assert torch.equal(out, want)


def test_crop_then_paste_roundtrip():
    mask = torch.zeros(1, 20, 20)
    mask[0, 4:14, 6:16] = 1.0
    box = torch.tensor([[6.0, 4.0, 16.0, 14.0]])
    crop = crop_masks(mask, box, 10)
    # 2x2 samples per bin sit 0.25 px from the pixel centre: at the border, half of them
    # read 3/4 of the mask and 1/4 of the background -> 0.875 per axis
    axis = torch.tensor([0.875] + [1.0] * 8 + [0.875])
    assert torch.allclose(crop[0], axis[:, None] * axis[None, :])
    assert torch.equal(paste_masks(crop, box, 20, 20), mask.bool())
