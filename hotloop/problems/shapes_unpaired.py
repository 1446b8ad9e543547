"""Unpaired image translation between two styles of generated shape scenes.

Domain A is :func:`~hotloop.problems.shapes_render.render_scene` as drawn:
randomly coloured shapes on a dark background. Domain B paints the visible
mask of every object in its class's palette colour (square red, disk green,
triangle blue, diamond yellow, cross magenta) on a light background with the
same pixel noise, so translating A to B needs the shape's class, and B to A
needs a plausible colour. A and B scenes are drawn independently (unpaired).

Batches: ``inputs`` (domain A) and ``targets`` (domain B), float32
``[B, 3, H, W]`` scaled to [-1, 1] (the range of a tanh generator). Batch ``i``
of epoch ``e`` depends only on ``(seed, split, e, i)``.
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

__all__ = ["UnpairedShapesHParams", "UnpairedShapes", "palette_style", "PALETTE"]

PALETTE = np.array([[0.9, 0.1, 0.1], [0.1, 0.75, 0.1], [0.1, 0.2, 0.9], [0.9, 0.8, 0.1], [0.8, 0.1, 0.8]],
                   dtype=np.float32)                     # one RGB colour per shape class
_LIGHT_BACKGROUND = 0.85
_NOISE_STD = 0.04


@dataclass(frozen=True)
class UnpairedShapesHParams(HParams):
    """Problem knobs live with the hparams so ``--hparams`` overrides reach them."""

    image_channels: int = 3
    image_size: int = 64
    shape_classes: int = 3
    max_objects: int = 3
    min_object_size: int = 10
    train_examples: int = 4096     # image pairs per training "epoch"
    eval_examples: int = 64


def palette_style(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    """float32 [3, H, W] in [0, 1]: the scene's objects in their class colours on a light background."""
    size = scene.image.shape[1]
    image = np.full((3, size, size), _LIGHT_BACKGROUND, dtype=np.float32)
    for mask, label in zip(scene.masks, scene.labels):
        image[:, mask] = PALETTE[label][:, None]
    image += rng.normal(0.0, _NOISE_STD, size=image.shape).astype(np.float32)
    return np.clip(image, 0.0, 1.0)


class _UnpairedBatches:
    """``rng -> batch`` of independent A and B scenes (picklable, for data workers)."""

    def __init__(self, a: UnpairedShapesHParams, batch_size: int) -> None:
        self.a, self.batch_size = a, batch_size

    def _scene(self, rng: np.random.Generator) -> Scene:
        a = self.a
        return render_scene(rng, a.image_size, max_objects=a.max_objects, num_classes=a.shape_classes,
                            min_size=a.min_object_size)

    def __call__(self, rng: np.random.Generator) -> Batch:
        domain_a = np.stack([self._scene(rng).image for _ in range(self.batch_size)])      # [B, 3, H, W]
        domain_b = np.stack([palette_style(self._scene(rng), rng) for _ in range(self.batch_size)])
        return {"inputs": torch.from_numpy(domain_a * 2 - 1), "targets": torch.from_numpy(domain_b * 2 - 1)}


@problems.register("shapes_unpaired")
class UnpairedShapes(Problem):
    """Translate shape scenes between the "random colours" and "class palette" styles."""

    task: ClassVar[str] = "image2image"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss",)
    default_hparams: ClassVar[str] = "cyclegan_small"

    @staticmethod
    def _hp(hp: HParams) -> UnpairedShapesHParams:
        out = hp if isinstance(hp, UnpairedShapesHParams) else UnpairedShapesHParams()
        if out.image_channels != 3 or not 1 <= out.shape_classes <= len(SHAPE_NAMES):
            raise HParamsError(f"shapes_unpaired: image_channels={out.image_channels} must be 3 and "
                             f"shape_classes={out.shape_classes} in 1..{len(SHAPE_NAMES)}")
        return out

    def spec(self, hp: HParams) -> ProblemSpec:
        a = self._hp(hp)
        return ProblemSpec(task="image2image", input_vocab_size=0, target_vocab_size=a.image_channels,
                           pad_id=-1)

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        a = self._hp(hp)
        return generated_reader(_UnpairedBatches(a, hp.batch_size), split, hp, train_examples=a.train_examples,
                                eval_examples=a.eval_examples, seed=a.seed + seed, workers=workers,
                                problem=self.name)

    def decode(self, ids: Any) -> str:
        return " ".join(str(int(i)) for i in ids)
