"""The shapes renderer, the detection_shapes problem, target validation and the COCO export."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hotloop.builtin import declare_builtins
from hotloop.errors import UserError
from hotloop.problems.detection_shapes import (DetectionShapesHParams, ImageTargets, InvalidTargetError,
                                               collate_targets)
from hotloop.problems.shapes_render import masks_to_boxes, render_scene
from hotloop.registry import problems


def _problem_and_hp(**kw):
    declare_builtins()
    hp = dataclasses.replace(DetectionShapesHParams(image_size=32, min_object_size=6, batch_size=4,
                                                    train_examples=16, eval_examples=8), **kw)
    return problems.get("detection_shapes")(), hp


def test_render_scene_invariants():
    for seed in range(20):
        scene = render_scene(np.random.default_rng(seed), 32, max_objects=5, num_classes=5, min_size=6)
        n = scene.labels.shape[0]
        assert scene.image.shape == (3, 32, 32) and scene.image.dtype == np.float32
        assert 0.0 <= scene.image.min() and scene.image.max() <= 1.0
        assert scene.masks.shape == (n, 32, 32) and 1 <= n <= 5
        assert ((0 <= scene.labels) & (scene.labels < 5)).all()
        assert scene.masks.reshape(n, -1).any(axis=1).all()                   # occluded-away objects dropped
        assert (scene.masks.sum(axis=0) <= 1).all()                           # visible parts are disjoint
        assert np.array_equal(scene.boxes, masks_to_boxes(scene.masks))
    again = render_scene(np.random.default_rng(3), 32, max_objects=5, num_classes=5)
    first = render_scene(np.random.default_rng(3), 32, max_objects=5, num_classes=5)
    assert np.array_equal(again.image, first.image) and np.array_equal(again.masks, first.masks)


def test_masks_to_boxes_hand_value():
    mask = np.zeros((1, 10, 12), dtype=bool)
    mask[0, 2:5, 7:8] = True
    assert masks_to_boxes(mask).tolist() == [[7.0, 2.0, 8.0, 5.0]]


def test_reader_batches_are_dense_deterministic_and_resumable():
    problem, hp = _problem_and_hp()
    assert problem.spec(hp).task == "detect"
    batches = list(problem.reader("train", hp, seed=1))
    assert len(batches) == 4
    b = batches[0]
    assert b["images"].shape == (4, 3, 32, 32) and b["images"].dtype == torch.float32
    assert b["boxes"].shape == (4, 4, 4) and b["labels"].shape == (4, 4) and b["masks"].shape == (4, 4, 32, 32)
    pad = b["labels"] < 0
    assert not b["masks"][pad].any() and (b["boxes"][pad] == 0).all()
    reader = problem.reader("train", hp, seed=1)
    it = iter(reader)
    next(it)
    state = reader.state_dict()
    resumed = problem.reader("train", hp, seed=1)
    resumed.load_state_dict(state)
    for x, y in zip(resumed, batches[1:]):
        assert all(torch.equal(x[k], y[k]) for k in x)
    other = next(iter(problem.reader("valid", hp, seed=1)))
    assert not torch.equal(other["images"], b["images"])


def _image():
    return np.zeros((3, 10, 10), dtype=np.float32)


def test_collate_empty_image_and_drop_degenerate():
    empty = ImageTargets(np.zeros((0, 4)), np.zeros(0, dtype=np.int64), np.zeros((0, 10, 10), dtype=bool))
    mask = np.zeros((2, 10, 10), dtype=bool)
    mask[0, 1:4, 1:4] = True
    two = ImageTargets(np.array([[1, 1, 4, 4], [5, 5, 5, 8]], dtype=np.float32), np.array([0, 1]), mask)
    batch = collate_targets([_image(), _image()], [empty, two], num_classes=2, max_objects=3,
                            drop_degenerate=True)
    assert batch["labels"].tolist() == [[-1, -1, -1], [0, -1, -1]]
    with pytest.raises(InvalidTargetError, match="image 1: object 1 has a degenerate box"):
        collate_targets([_image(), _image()], [empty, two], num_classes=2, max_objects=3)


def test_collate_rejects_bad_class_and_disagreeing_mask():
    mask = np.zeros((1, 10, 10), dtype=bool)
    mask[0, 1:4, 1:4] = True
    box = np.array([[1, 1, 4, 4]], dtype=np.float32)
    with pytest.raises(UserError, match="class id 3, outside"):
        collate_targets([_image()], [ImageTargets(box, np.array([3]), mask)], num_classes=3, max_objects=2)
    with pytest.raises(UserError, match="class id -2"):
        collate_targets([_image()], [ImageTargets(box, np.array([-2]), mask)], num_classes=3, max_objects=2)
    far = np.zeros((1, 10, 10), dtype=bool)
    far[0, 7:9, 7:9] = True
    with pytest.raises(InvalidTargetError, match="outside its box"):
        collate_targets([_image()], [ImageTargets(box, np.array([0]), far)], num_classes=3, max_objects=2)
    with pytest.raises(InvalidTargetError, match="is empty"):
        collate_targets([_image()], [ImageTargets(box, np.array([0]), np.zeros_like(far))],
                        num_classes=3, max_objects=2)


def test_coco_export_reads_back_with_pycocotools(tmp_path):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    from hotloop.detection import export_coco
    import contextlib
    import io

    problem, hp = _problem_and_hp()
    path = export_coco(problem, hp, "valid", tmp_path, max_images=6)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(path))
    batches = list(problem.reader("valid", hp))
    labels = torch.cat([b["labels"] for b in batches])[:6]
    masks = torch.cat([b["masks"] for b in batches])[:6]
    boxes = torch.cat([b["boxes"] for b in batches])[:6]
    assert len(coco.getImgIds()) == 6 and len(coco.getAnnIds()) == int((labels >= 0).sum())
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == ["square", "disk", "triangle"]
    ann = coco.loadAnns(coco.getAnnIds(imgIds=[2]))[0]
    decoded = mask_utils.decode(ann["segmentation"]).astype(bool)
    assert np.array_equal(decoded, masks[1, 0].numpy())
    x1, y1, x2, y2 = boxes[1, 0].tolist()
    assert ann["bbox"] == [x1, y1, x2 - x1, y2 - y1] and ann["category_id"] == int(labels[1, 0]) + 1
    assert ann["area"] == float(masks[1, 0].sum()) and (tmp_path / "images" / "000002.png").exists()
