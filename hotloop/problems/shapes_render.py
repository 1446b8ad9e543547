"""A deterministic renderer of simple shape scenes with exact instance labels.

:func:`render_scene` draws up to ``max_objects`` filled shapes (square, disk,
triangle, diamond, cross: the first ``num_classes`` of them) of varied sizes
and random colours on a noisy background. Objects drawn later occlude earlier
ones: each mask is the object's *visible* part, each box is tight around its
visible mask, and an object occluded to nothing is dropped. The scene depends
only on the generator's state, so ``np.random.default_rng(key)`` makes it
reproducible.

Box convention: ``xyxy`` in pixel-edge coordinates, so a mask whose pixels
span columns ``c0..c1`` has ``x1 = c0`` and ``x2 = c1 + 1`` (width >= 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Scene", "SHAPE_NAMES", "render_scene", "masks_to_boxes"]

SHAPE_NAMES: tuple[str, ...] = ("square", "disk", "triangle", "diamond", "cross")

_BACKGROUND_MAX = 0.3     # background base colour channels lie in [0, _BACKGROUND_MAX]
_OBJECT_MIN = 0.45        # object colour channels lie in [_OBJECT_MIN, 1]
_NOISE_STD = 0.04


@dataclass
class Scene:
    """One rendered image and its instances (``N`` may be 0 only for an empty scene)."""

    image: np.ndarray    # float32 [3, H, W] in [0, 1]
    masks: np.ndarray    # bool [N, H, W], visible part of each object
    labels: np.ndarray   # int64 [N], class ids in [0, num_classes)
    boxes: np.ndarray    # float32 [N, 4], xyxy tight around each mask


def _square(dx: np.ndarray, dy: np.ndarray, half: float) -> np.ndarray:
    return (np.abs(dx) <= half) & (np.abs(dy) <= half)


def _disk(dx: np.ndarray, dy: np.ndarray, half: float) -> np.ndarray:
    return dx * dx + dy * dy <= half * half


def _triangle(dx: np.ndarray, dy: np.ndarray, half: float) -> np.ndarray:
    # apex at the top (dy = -half), base at dy = +half, base width 2 * half
    depth = (dy + half) / (2 * half)                       # 0 at the apex, 1 at the base
    return (dy <= half) & (depth >= 0) & (np.abs(dx) <= depth * half)


def _diamond(dx: np.ndarray, dy: np.ndarray, half: float) -> np.ndarray:
    return np.abs(dx) + np.abs(dy) <= half


def _cross(dx: np.ndarray, dy: np.ndarray, half: float) -> np.ndarray:
    arm = max(half / 3.0, 0.75)
    inside = _square(dx, dy, half)
    return inside & ((np.abs(dx) <= arm) | (np.abs(dy) <= arm))


_SHAPES: tuple[Callable[[np.ndarray, np.ndarray, float], np.ndarray], ...] = (
    _square, _disk, _triangle, _diamond, _cross)


def masks_to_boxes(masks: np.ndarray) -> np.ndarray:
    """bool [N, H, W] -> float32 [N, 4] tight xyxy boxes (pixel edges); empty masks give zeros."""
    boxes = np.zeros((masks.shape[0], 4), dtype=np.float32)
    for i, mask in enumerate(masks):
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        if rows.size:
            boxes[i] = (cols[0], rows[0], cols[-1] + 1, rows[-1] + 1)
    return boxes


def render_scene(rng: np.random.Generator, size: int, *, max_objects: int = 4, num_classes: int = 3,
                 min_size: int = 6) -> Scene:
    """Render one ``size x size`` scene with 1..``max_objects`` objects drawn from ``rng``.

    Object extents (side or diameter) lie in ``[min_size, max(min_size, size // 2)]``
    and every object lies fully inside the image before occlusion.
    """
    if not 1 <= num_classes <= len(SHAPE_NAMES):
        raise ValueError(f"render_scene: num_classes={num_classes} must be in 1..{len(SHAPE_NAMES)}")
    if max_objects < 1:
        raise ValueError(f"render_scene: max_objects={max_objects} must be >= 1")
    if not 2 <= min_size <= size:
        raise ValueError(f"render_scene: min_size={min_size} must be in 2..size={size}")
    max_extent = max(min_size, size // 2)
    centres = np.arange(size, dtype=np.float32) + 0.5                     # pixel centres
    ys, xs = centres[:, None], centres[None, :]                          # [H, 1], [1, W]

    background = rng.uniform(0.0, _BACKGROUND_MAX, size=3).astype(np.float32)
    image = np.broadcast_to(background[:, None, None], (3, size, size)).copy()  # [3, H, W]

    count = int(rng.integers(1, max_objects + 1))
    masks: list[np.ndarray] = []
    labels: list[int] = []
    for _ in range(count):
        label = int(rng.integers(0, num_classes))
        extent = int(rng.integers(min_size, max_extent + 1))
        half = extent / 2.0
        cx = rng.uniform(half, size - half)
        cy = rng.uniform(half, size - half)
        mask = _SHAPES[label](xs - cx, ys - cy, half)                      # [H, W]
        if not mask.any():
            continue
        colour = rng.uniform(_OBJECT_MIN, 1.0, size=3).astype(np.float32)
        image[:, mask] = colour[:, None]
        for earlier in masks:
            earlier &= ~mask
        masks.append(mask)
        labels.append(label)

    image += rng.normal(0.0, _NOISE_STD, size=image.shape).astype(np.float32)
    np.clip(image, 0.0, 1.0, out=image)

    keep = [i for i, m in enumerate(masks) if m.any()]                    # drop fully occluded
    mask_array = (np.stack([masks[i] for i in keep]) if keep
                  else np.zeros((0, size, size), dtype=bool))             # [N, H, W]
    return Scene(image=image.astype(np.float32, copy=False), masks=mask_array,
                 labels=np.asarray([labels[i] for i in keep], dtype=np.int64),
                 boxes=masks_to_boxes(mask_array))
