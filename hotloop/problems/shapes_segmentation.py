"""Semantic segmentation of generated shape scenes (exact masks, no download).

Each example is a scene from :func:`~hotloop.problems.shapes_render.render_scene`:
``inputs`` float32 ``[B, 3, H, W]`` in [0, 1] and ``targets`` int64 ``[B, H, W]``
holding 0 for background and ``c + 1`` for a pixel of shape class ``c``
(objects drawn later occlude earlier ones, so every pixel has one label).
Batch ``i`` of epoch ``e`` depends only on ``(seed, split, e, i)``, so readers
resume exactly (:class:`~hotloop.problems.algorithmic.IndexedReader`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..hparams import HParams, HParamsError
from ..registry import problems
from .algorithmic import IndexedReader, generated_reader
from .base import Batch, Problem, ProblemSpec
from .shapes_render import SHAPE_NAMES, Scene, render_scene

__all__ = ["ShapesHParams", "ShapesSegmentation", "class_map"]



@dataclass(frozen=True)
class ShapesHParams(HParams):
    """Problem knobs live with the hparams so ``--hparams`` overrides reach them."""

    image_channels: int = 3
    image_size: int = 64           # H = W
    shape_classes: int = 3         # the first N of square, disk, triangle, diamond, cross
    max_objects: int = 4
    min_object_size: int = 6       # pixels (side or diameter)
    train_examples: int = 51200    # examples per training "epoch"
    eval_examples: int = 1024


def class_map(scene: Scene) -> np.ndarray:
    """int64 [H, W]: 0 background, ``label + 1`` on each object's visible mask."""
    out = np.zeros(scene.image.shape[1:], dtype=np.int64)
    for mask, label in zip(scene.masks, scene.labels):
        out[mask] = label + 1
    return out


class _SceneBatches:
    """``rng -> batch`` of rendered scenes and their class maps (picklable, for data workers)."""

    def __init__(self, a: ShapesHParams, batch_size: int) -> None:
        self.a, self.batch_size = a, batch_size

    def __call__(self, rng: np.random.Generator) -> Batch:
        a = self.a
        scenes = [render_scene(rng, a.image_size, max_objects=a.max_objects, num_classes=a.shape_classes,
                               min_size=a.min_object_size) for _ in range(self.batch_size)]
        images = np.stack([s.image for s in scenes])            # [B, 3, H, W]
        targets = np.stack([class_map(s) for s in scenes])      # [B, H, W]
        return {"inputs": torch.from_numpy(images), "targets": torch.from_numpy(targets)}


@problems.register("segment_shapes")
class ShapesSegmentation(Problem):
    """Per-pixel classification of background and ``shape_classes`` shape kinds."""

    task: ClassVar[str] = "segment"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy", "miou")
    default_hparams: ClassVar[str] = "deeplabv3plus_small"

    @staticmethod
    def _hp(hp: HParams) -> ShapesHParams:
        out = hp if isinstance(hp, ShapesHParams) else ShapesHParams()
        if out.image_channels != 3:
            raise HParamsError(f"segment_shapes: scenes are RGB; image_channels={out.image_channels} must be 3")
        if not 1 <= out.shape_classes <= len(SHAPE_NAMES):
            raise HParamsError(f"segment_shapes: shape_classes={out.shape_classes} must be in "
                             f"1..{len(SHAPE_NAMES)}")
        return out

    def spec(self, hp: HParams) -> ProblemSpec:
        a = self._hp(hp)
        return ProblemSpec(task="segment", input_vocab_size=0, target_vocab_size=a.shape_classes + 1,
                           max_input_length=0, max_target_length=0, pad_id=-1)

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        a = self._hp(hp)
        return generated_reader(_SceneBatches(a, hp.batch_size), split, hp, train_examples=a.train_examples,
                                eval_examples=a.eval_examples, seed=a.seed + seed, workers=workers,
                                problem=self.name)

    def decode(self, ids: Any) -> str:
        names = ("background",) + SHAPE_NAMES
        return " ".join(names[int(i)] for i in ids)
