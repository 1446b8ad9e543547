"""COCO-format ground truth and results, readable by any COCO tool (pycocotools).

Ground truth (:func:`coco_ground_truth`) is a dict with ``images``,
``annotations`` (``bbox`` as ``[x, y, w, h]``, ``area`` = mask area when a
mask is given, else box area, ``iscrowd`` = 0, ``segmentation`` as compressed
RLE from ``pycocotools.mask.encode``) and ``categories``. Category ids are the
class ids + 1 (COCO reserves 0); image ids are the image's position + 1.

:func:`export_coco` writes a problem split as ``annotations.json`` plus one PNG
per image (``images/000001.png``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["encode_mask", "coco_ground_truth", "coco_results", "export_coco"]


def encode_mask(mask: np.ndarray) -> dict[str, Any]:
    """bool [H, W] -> COCO compressed RLE with a JSON-safe ``counts`` string."""
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


def _xywh(box: Sequence[float]) -> list[float]:
    x1, y1, x2, y2 = (float(v) for v in box)
    return [x1, y1, x2 - x1, y2 - y1]


def coco_ground_truth(targets: Sequence[dict[str, np.ndarray]], height: int, width: int,
                      category_names: Sequence[str], file_names: Sequence[str] | None = None) -> dict[str, Any]:
    """Per-image targets (``boxes`` [N, 4] xyxy, ``labels`` [N], optional ``masks`` [N, H, W]) -> COCO dict."""
    images, annotations = [], []
    for index, target in enumerate(targets):
        image_id = index + 1
        entry = {"id": image_id, "height": int(height), "width": int(width)}
        entry["file_name"] = file_names[index] if file_names is not None else f"{image_id:06d}.png"
        images.append(entry)
        masks = target.get("masks")
        for i, (box, label) in enumerate(zip(np.asarray(target["boxes"]), np.asarray(target["labels"]))):
            bbox = _xywh(box)
            ann: dict[str, Any] = {"id": len(annotations) + 1, "image_id": image_id,
                                   "category_id": int(label) + 1, "bbox": bbox, "iscrowd": 0,
                                   "area": bbox[2] * bbox[3]}
            if masks is not None:
                mask = np.asarray(masks[i]).astype(bool)
                ann["segmentation"] = encode_mask(mask)
                ann["area"] = float(mask.sum())
            annotations.append(ann)
    categories = [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(category_names)]
    return {"info": {"description": "hotloop detection ground truth"}, "images": images,
            "annotations": annotations, "categories": categories}


def coco_results(predictions: Sequence[dict[str, np.ndarray]], *, with_masks: bool) -> list[dict[str, Any]]:
    """Per-image predictions (``boxes`` xyxy, ``scores``, ``labels``, optional ``masks``) -> COCO results."""
    results = []
    for index, pred in enumerate(predictions):
        masks = pred.get("masks") if with_masks else None
        for i, (box, score, label) in enumerate(zip(np.asarray(pred["boxes"]), np.asarray(pred["scores"]),
                                                    np.asarray(pred["labels"]))):
            entry: dict[str, Any] = {"image_id": index + 1, "category_id": int(label) + 1,
                                     "bbox": _xywh(box), "score": float(score)}
            if masks is not None:
                entry["segmentation"] = encode_mask(np.asarray(masks[i]).astype(bool))
            results.append(entry)
    return results


def export_coco(problem: Any, hp: Any, split: str, out_dir: str | Path, *, max_images: int | None = None,
                seed: int = 0) -> Path:
    """Write ``split`` of a detection problem as COCO json + PNG images; returns the json path."""
    import matplotlib.image

    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    targets: list[dict[str, np.ndarray]] = []
    names: list[str] = []
    height = width = 0
    for batch in problem.reader(split, hp, seed=seed, shuffle=False):
        images = batch["images"].numpy()                                       # [B, 3, H, W]
        height, width = images.shape[2:]
        for row in range(images.shape[0]):
            if max_images is not None and len(targets) >= max_images:
                break
            keep = batch["labels"][row].numpy() >= 0
            targets.append({"boxes": batch["boxes"][row].numpy()[keep], "labels": batch["labels"][row].numpy()[keep],
                            "masks": batch["masks"][row].numpy()[keep]})
            names.append(f"images/{len(targets):06d}.png")
            matplotlib.image.imsave(out / names[-1], images[row].transpose(1, 2, 0).clip(0, 1))
        if max_images is not None and len(targets) >= max_images:
            break
    coco = coco_ground_truth(targets, height, width, problem.category_names(hp), names)
    path = out / "annotations.json"
    path.write_text(json.dumps(coco))
    return path
