"""Brute-force references for the ops tests (plain Python loops, float64)."""
from __future__ import annotations

import math

import torch


def random_boxes(gen: torch.Generator, n: int, size: float = 50.0, min_wh: float = 1.0) -> torch.Tensor:
    """[n, 4] random xyxy boxes inside [0, size]^2 with sides >= min_wh (float64, CPU)."""
    xy = torch.rand(n, 2, generator=gen, dtype=torch.float64) * size * 0.8
    wh = min_wh + torch.rand(n, 2, generator=gen, dtype=torch.float64) * size * 0.4
    return torch.cat((xy, xy + wh), dim=1)


def iou_scalar(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def greedy_nms(boxes, scores, threshold, groups=None) -> list[int]:
    """Textbook greedy NMS: visit by descending score (stable), drop overlaps of kept boxes."""
    boxes, scores = boxes.tolist(), scores.tolist()
    groups = groups.tolist() if groups is not None else [0] * len(boxes)
    order = sorted(range(len(boxes)), key=lambda i: -scores[i])
    kept: list[int] = []
    for i in order:
        if all(groups[j] != groups[i] or iou_scalar(boxes[j], boxes[i]) <= threshold for j in kept):
            kept.append(i)
    return kept


def bilinear(plane, y: float, x: float) -> float:
    """Mask R-CNN's RoIAlign bilinear sample of a 2-D list ``plane`` (H x W)."""
    h, w = len(plane), len(plane[0])
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(math.floor(y)), int(math.floor(x))
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * plane[y0][x0] + (1 - ly) * lx * plane[y0][x1]
            + ly * (1 - lx) * plane[y1][x0] + ly * lx * plane[y1][x1])


def roi_align_ref(features, rois, out_h, out_w, scale, sampling_ratio, aligned) -> torch.Tensor:
    """One region, one channel, one bin, one sample at a time."""
    feats = features.tolist()
    out = torch.zeros(len(rois), features.shape[1], out_h, out_w, dtype=torch.float64)
    off = 0.5 if aligned else 0.0
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        sx, sy = x1 * scale - off, y1 * scale - off
        rw, rh = x2 * scale - off - sx, y2 * scale - off - sy
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bw, bh = rw / out_w, rh / out_h
        gh = sampling_ratio if sampling_ratio > 0 else max(1, math.ceil(rh / out_h))
        gw = sampling_ratio if sampling_ratio > 0 else max(1, math.ceil(rw / out_w))
        for c in range(features.shape[1]):
            plane = feats[int(b)][c]
            for ph in range(out_h):
                for pw in range(out_w):
                    total = 0.0
                    for iy in range(gh):
                        y = sy + ph * bh + (iy + 0.5) * bh / gh
                        for ix in range(gw):
                            x = sx + pw * bw + (ix + 0.5) * bw / gw
                            total += bilinear(plane, y, x)
                    out[k, c, ph, pw] = total / (gh * gw)
    return out


def paste_ref(mask, box, height: int, width: int) -> torch.Tensor:
    """Soft pasted mask: bilinear read of the zero-padded M x M mask at each pixel centre in the box."""
    m = mask.tolist()
    size = len(m)
    x1, y1, x2, y2 = box.tolist()
    out = torch.zeros(height, width, dtype=torch.float64)

    def read(r: int, c: int) -> float:
        return m[r][c] if 0 <= r < size and 0 <= c < size else 0.0

    for yy in range(height):
        for xx in range(width):
            px, py = xx + 0.5, yy + 0.5
            if not (x1 <= px <= x2 and y1 <= py <= y2):
                continue
            u = (px - x1) / (x2 - x1) * size - 0.5
            v = (py - y1) / (y2 - y1) * size - 0.5
            c0, r0 = math.floor(u), math.floor(v)
            fu, fv = u - c0, v - r0
            out[yy, xx] = ((1 - fv) * (1 - fu) * read(r0, c0) + (1 - fv) * fu * read(r0, c0 + 1)
                           + fv * (1 - fu) * read(r0 + 1, c0) + fv * fu * read(r0 + 1, c0 + 1))
    return out
