"""A learnable synthetic image-classification problem (no download).

Images are seeded Gaussian noise ``[B, C, H, W]`` (float32, ``inputs``); the
label (``targets`` int64 ``[B, 1]``) is the argmax of a fixed random linear
*teacher* applied to the image average-pooled to a 4x4 grid, so a small conv
net can learn it. The teacher depends only on ``teacher_seed``; batch ``i`` of
epoch ``e`` only on ``(seed, split, e, i)``, so readers resume exactly
(:class:`~hotloop.problems.algorithmic.IndexedReader`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..hparams import HParams
from ..registry import problems
from .algorithmic import IndexedReader, generated_reader
from .base import Batch, Problem, ProblemSpec

__all__ = ["SyntheticImageHParams", "SyntheticImages", "teacher_labels", "TEACHER_GRID"]

TEACHER_GRID = 4  # the teacher sees the image average-pooled to a TEACHER_GRID x TEACHER_GRID grid


@dataclass(frozen=True)
class SyntheticImageHParams(HParams):
    """Problem knobs live with the hparams so ``--hparams`` overrides reach them."""

    image_channels: int = 3
    image_size: int = 32           # H = W; a multiple of TEACHER_GRID
    num_classes: int = 10
    teacher_seed: int = 7
    train_examples: int = 51200    # examples per training "epoch"
    eval_examples: int = 2048


def _teacher(hp: SyntheticImageHParams) -> np.ndarray:
    rng = np.random.default_rng([hp.teacher_seed, hp.image_channels, hp.num_classes])
    features = hp.image_channels * TEACHER_GRID * TEACHER_GRID
    return rng.standard_normal((features, hp.num_classes)).astype(np.float32)  # [F, K]


def teacher_labels(images: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """images [B, C, H, W] -> labels [B] (argmax of the teacher on the 4x4-pooled image)."""
    b, c, h, w = images.shape
    g = TEACHER_GRID
    pooled = images.reshape(b, c, g, h // g, g, w // g).mean(axis=(3, 5))      # [B, C, g, g]
    return (pooled.reshape(b, -1) @ weights).argmax(axis=1)                     # [B]


class _TeacherBatches:
    """``rng -> batch`` of noise images labelled by the teacher (picklable, for data workers)."""

    def __init__(self, weights: np.ndarray, shape: tuple[int, int, int, int]) -> None:
        self.weights, self.shape = weights, shape

    def __call__(self, rng: np.random.Generator) -> Batch:
        images = rng.standard_normal(self.shape, dtype=np.float32)                  # [B, C, H, W]
        labels = teacher_labels(images, self.weights).astype(np.int64)[:, None]     # [B, 1]
        return {"inputs": torch.from_numpy(images), "targets": torch.from_numpy(labels)}


@problems.register("image_synthetic")
class SyntheticImages(Problem):
    """Classify seeded noise images by a fixed random teacher."""

    task: ClassVar[str] = "classify"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    default_hparams: ClassVar[str] = "conv_net_base"

    @staticmethod
    def _hp(hp: HParams) -> SyntheticImageHParams:
        out = hp if isinstance(hp, SyntheticImageHParams) else SyntheticImageHParams()
        if out.image_size % TEACHER_GRID:
            raise ValueError(f"image_synthetic: image_size={out.image_size} must be a multiple of {TEACHER_GRID}")
        return out

    def spec(self, hp: HParams) -> ProblemSpec:
        a = self._hp(hp)
        return ProblemSpec(task="classify", input_vocab_size=0, target_vocab_size=a.num_classes,
                           max_input_length=0, max_target_length=1, pad_id=-1)

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        a = self._hp(hp)
        make_batch = _TeacherBatches(_teacher(a), (hp.batch_size, a.image_channels, a.image_size, a.image_size))
        return generated_reader(make_batch, split, hp, train_examples=a.train_examples,
                                eval_examples=a.eval_examples, seed=a.seed + seed, workers=workers,
                                problem=self.name)

    def decode(self, ids: Any) -> str:
        return " ".join(str(int(i)) for i in ids)
