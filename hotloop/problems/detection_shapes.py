"""``detection_shapes``: instance detection on generated shape scenes (exact labels).

Scenes come from :func:`~hotloop.problems.shapes_render.render_scene`. Batch
``i`` of epoch ``e`` depends only on ``(seed, split, e, i)``
(:class:`~hotloop.problems.algorithmic.IndexedReader`), so readers resume
exactly. Per-image targets are padded to ``max_objects`` so every batch has the
same dense shapes:

- ``images``: float32 ``[B, 3, H, W]`` in [0, 1]
- ``boxes``:  float32 ``[B, Nmax, 4]`` xyxy pixels (padding rows are 0)
- ``labels``: int64 ``[B, Nmax]`` class ids, ``-1`` = padding
- ``masks``:  bool ``[B, Nmax, H, W]`` visible instance masks (padding rows are empty)

:func:`collate_targets` builds such a batch from any per-image targets and
validates them (see :class:`InvalidTargetError` for the rules).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch

from ..errors import UserError
from ..hparams import HParams
from ..registry import problems
from .algorithmic import IndexedReader, generated_reader
from .base import Batch, Problem, ProblemSpec
from .shapes_render import SHAPE_NAMES, Scene, masks_to_boxes, render_scene

__all__ = ["DetectionShapesHParams", "DetectionShapes", "InvalidTargetError", "ImageTargets",
           "validate_targets", "collate_targets", "SceneBatches", "MASK_BOX_TOLERANCE"]

MASK_BOX_TOLERANCE = 1.0   # a mask may stick out of its box by at most this many pixels


class InvalidTargetError(UserError):
    """A detection target that cannot be trained on.

    Rules (checked by :func:`validate_targets`):

    - an image with no objects is valid (all rows are padding);
    - a degenerate box (``x2 <= x1`` or ``y2 <= y1``, e.g. zero width) is an error,
      or is dropped together with its label and mask when ``drop_degenerate=True``;
    - a class id outside ``[0, num_classes)`` is an error;
    - a mask that disagrees with its box (empty, or pixels more than
      :data:`MASK_BOX_TOLERANCE` outside it) is an error;
    - more objects than ``max_objects`` is an error.
    """


@dataclass(frozen=True)
class DetectionShapesHParams(HParams):
    """Problem knobs live with the hparams so ``--hparams`` overrides reach them."""

    image_size: int = 64
    max_objects: int = 4
    num_classes: int = 3
    min_object_size: int = 8
    train_examples: int = 8192     # images per training "epoch"
    eval_examples: int = 256


@dataclass
class ImageTargets:
    """One image's targets (numpy): boxes float [N, 4] xyxy, labels int [N], masks bool [N, H, W] or None."""

    boxes: np.ndarray
    labels: np.ndarray
    masks: np.ndarray | None = None


def validate_targets(targets: ImageTargets, *, num_classes: int, height: int, width: int,
                     drop_degenerate: bool = False, where: str = "image") -> ImageTargets:
    """Check one image's targets against the rules of :class:`InvalidTargetError`; return them (filtered)."""
    boxes = np.asarray(targets.boxes, dtype=np.float32).reshape(-1, 4)
    labels = np.asarray(targets.labels).reshape(-1)
    masks = None if targets.masks is None else np.asarray(targets.masks).astype(bool)
    if labels.shape[0] != boxes.shape[0] or (masks is not None and masks.shape[0] != boxes.shape[0]):
        raise InvalidTargetError(f"{where}: {boxes.shape[0]} boxes, {labels.shape[0]} labels and "
                                 f"{None if masks is None else masks.shape[0]} masks do not match")
    if masks is not None and masks.shape[1:] != (height, width):
        raise InvalidTargetError(f"{where}: masks have size {masks.shape[1:]}, the image is {(height, width)}")
    if not np.isfinite(boxes).all():
        raise InvalidTargetError(f"{where}: a box has a non-finite coordinate")
    degenerate = (boxes[:, 2] <= boxes[:, 0]) | (boxes[:, 3] <= boxes[:, 1])
    if degenerate.any():
        if not drop_degenerate:
            i = int(np.flatnonzero(degenerate)[0])
            raise InvalidTargetError(f"{where}: object {i} has a degenerate box {boxes[i].tolist()} "
                                     "(zero or negative width/height)")
        keep = ~degenerate
        boxes, labels = boxes[keep], labels[keep]
        masks = None if masks is None else masks[keep]
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidTargetError(f"{where}: object {i} has class id {int(labels[i])}, "
                                 f"outside [0, {num_classes})")
    if masks is not None and masks.shape[0]:
        tight = masks_to_boxes(masks)                                             # [N, 4]
        empty = ~masks.reshape(masks.shape[0], -1).any(axis=1)
        outside = ((tight[:, :2] < boxes[:, :2] - MASK_BOX_TOLERANCE).any(axis=1)
                   | (tight[:, 2:] > boxes[:, 2:] + MASK_BOX_TOLERANCE).any(axis=1))
        wrong = empty | outside
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            why = "is empty" if empty[i] else f"spans {tight[i].tolist()}, outside its box {boxes[i].tolist()}"
            raise InvalidTargetError(f"{where}: the mask of object {i} {why}")
    return ImageTargets(boxes=boxes, labels=labels.astype(np.int64), masks=masks)


def collate_targets(images: Sequence[np.ndarray], targets: Sequence[ImageTargets], *, num_classes: int,
                    max_objects: int, drop_degenerate: bool = False) -> Batch:
    """Validate per-image targets and pad them into one dense batch (see the module docstring)."""
    batch = len(images)
    _, height, width = np.asarray(images[0]).shape
    boxes = np.zeros((batch, max_objects, 4), dtype=np.float32)
    labels = np.full((batch, max_objects), -1, dtype=np.int64)
    masks = np.zeros((batch, max_objects, height, width), dtype=bool)
    for row, target in enumerate(targets):
        clean = validate_targets(target, num_classes=num_classes, height=height, width=width,
                                 drop_degenerate=drop_degenerate, where=f"image {row}")
        n = clean.labels.shape[0]
        if n > max_objects:
            raise InvalidTargetError(f"image {row}: {n} objects, more than max_objects={max_objects}")
        boxes[row, :n], labels[row, :n] = clean.boxes, clean.labels
        if clean.masks is not None:
            masks[row, :n] = clean.masks
    return {"images": torch.from_numpy(np.stack(images).astype(np.float32, copy=False)),
            "boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels),
            "masks": torch.from_numpy(masks)}


class SceneBatches:
    """``rng -> batch`` of ``batch_size`` rendered scenes (picklable, for data workers)."""

    def __init__(self, a: DetectionShapesHParams, batch_size: int) -> None:
        self.a, self.batch_size = a, batch_size

    def __call__(self, rng: np.random.Generator) -> Batch:
        a = self.a
        scenes: list[Scene] = [render_scene(rng, a.image_size, max_objects=a.max_objects, num_classes=a.num_classes,
                                            min_size=a.min_object_size) for _ in range(self.batch_size)]
        return collate_targets([s.image for s in scenes], [ImageTargets(s.boxes, s.labels, s.masks) for s in scenes],
                               num_classes=a.num_classes, max_objects=a.max_objects)


@problems.register("detection_shapes")
class DetectionShapes(Problem):
    """Detect and segment squares, disks, triangles, ... in noisy generated scenes."""

    task: ClassVar[str] = "detect"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "box_ap", "box_ap50", "mask_ap", "mask_ap50")
    default_hparams: ClassVar[str] = "yolov3_shapes"
    model_hparams: ClassVar[Mapping[str, str]] = {"yolov3": "yolov3_shapes", "mask_rcnn": "mask_rcnn_shapes"}

    @staticmethod
    def _hp(hp: HParams) -> DetectionShapesHParams:
        out = hp if isinstance(hp, DetectionShapesHParams) else DetectionShapesHParams()
        if not 1 <= out.num_classes <= len(SHAPE_NAMES):
            raise UserError(f"detection_shapes: num_classes={out.num_classes} must be in 1..{len(SHAPE_NAMES)}")
        if out.image_size < 2 * out.min_object_size or out.max_objects < 1:
            raise UserError(f"detection_shapes: image_size={out.image_size} must be >= 2 * min_object_size="
                            f"{out.min_object_size} and max_objects={out.max_objects} >= 1")
        return out

    def spec(self, hp: HParams) -> ProblemSpec:
        a = self._hp(hp)
        return ProblemSpec(task="detect", input_vocab_size=0, target_vocab_size=a.num_classes,
                           max_input_length=0, max_target_length=a.max_objects, pad_id=-1)

    def category_names(self, hp: HParams) -> list[str]:
        return list(SHAPE_NAMES[:self._hp(hp).num_classes])

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        a = self._hp(hp)
        return generated_reader(SceneBatches(a, hp.batch_size), split, hp, train_examples=a.train_examples,
                                eval_examples=a.eval_examples, seed=a.seed + seed, workers=workers,
                                problem=self.name)

    def decode(self, ids: Any) -> str:
        names = SHAPE_NAMES
        return " ".join(names[int(i)] if 0 <= int(i) < len(names) else str(int(i)) for i in ids if int(i) >= 0)
