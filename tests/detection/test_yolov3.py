"""YOLOv3: target assignment by hand, forward/backward, multi-scale, and a short overfit."""
from __future__ import annotations

import dataclasses
import math

import torch

from hotloop.models.yolo_loss import YoloScale, best_anchor, yolo_loss
from hotloop.models.yolov3 import YoloV3, yolov3_tiny
from hotloop.problems.detection_shapes import DetectionShapes


def test_best_anchor_hand_values():
    anchors = torch.tensor([[4.0, 4.0], [8.0, 8.0], [16.0, 4.0]])
    gt = torch.tensor([[5.0, 5.0], [15.0, 5.0], [8.0, 9.0]])
    assert best_anchor(gt, anchors).tolist() == [0, 2, 1]


def test_single_box_gets_one_positive_and_exact_targets():
    scales = [YoloScale(8, ((4.0, 4.0), (6.0, 6.0), (8.0, 8.0))),
              YoloScale(16, ((12.0, 12.0), (16.0, 16.0), (20.0, 20.0)))]
    outputs = [torch.zeros(1, 3, 4, 4, 5 + 2, requires_grad=True), torch.zeros(1, 3, 2, 2, 5 + 2, requires_grad=True)]
    boxes = torch.tensor([[[4.0, 20.0, 20.0, 36.0], [0, 0, 0, 0]]])    # 16 x 16 centred at (12, 28); padding row
    labels = torch.tensor([[1, -1]])
    parts = yolo_loss(outputs, scales, boxes, labels, (32, 32), 2, ignore_threshold=1.0)
    assert parts.positives.item() == 1.0
    # zero logits: objectness BCE is log 2 per prediction (3*16 + 3*4 = 60 of them)
    assert math.isclose(parts.objectness.item(), 60 * math.log(2), rel_tol=1e-5)
    # class BCE at logits 0: 2 classes * log 2 for the one positive
    assert math.isclose(parts.classification.item(), 2 * math.log(2), rel_tol=1e-5)
    # the box goes to scale 1, anchor 1 (16 x 16), cell (0, 1) with offset (0.75, 0.75), tw = th = 0:
    # xy: 2 * (BCE(0.5 | 0.75) - H(0.75)); wh: 0; weight 2 - 256 / 1024
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert math.isclose(parts.box.item(), 1.75 * 2 * (math.log(2) - h), rel_tol=1e-5)
    parts.total.backward()
    grad = outputs[1].grad[0, 1, 1, 0]                                    # anchor 1, row 1, col 0
    assert grad[4] < 0 and grad[6] < 0 and grad[5] > 0                    # raise obj and class 1, lower class 0
    assert outputs[0].grad[..., 5:].abs().sum() == 0                      # no class gradient on scale 0


def _setup(**kw):
    hp = dataclasses.replace(yolov3_tiny(), **kw)
    problem = DetectionShapes()
    torch.manual_seed(0)
    return hp, problem, YoloV3(hp, problem.spec(hp))


def test_forward_backward_predict_shapes():
    hp, problem, model = _setup()
    batch = next(iter(problem.reader("train", hp)))
    outputs, _ = model(batch)
    assert [tuple(o.shape) for o in outputs] == [(4, 3, 4, 4, 8), (4, 3, 2, 2, 8), (4, 3, 1, 1, 8)]
    out = model.loss(batch)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert out.stats["examples"].item() == 4 and out.stats["nll_sum"].item() > 0
    model.eval()
    dets = model.predict(batch["images"])
    assert len(dets) == 4 and all(d["boxes"].shape[0] <= hp.max_detections for d in dets)


def test_multiscale_resizes_images_and_boxes():
    hp, problem, model = _setup(multiscale_sizes=(64,))
    batch = next(iter(problem.reader("train", hp)))
    scaled = model._maybe_rescale(batch)
    assert scaled["images"].shape[-1] == 64 and torch.equal(scaled["boxes"], batch["boxes"] * 2)
    model.loss(batch).loss.backward()
    model.eval()
    assert model._maybe_rescale(batch) is batch


def test_overfit_few_images():
    torch.set_num_threads(1)
    hp, problem, model = _setup()
    batch = next(iter(problem.reader("train", hp)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        out = model.loss(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.25 * losses[0], losses[::10]


def test_evaluate_detection_reports_loss_and_coco_metrics():
    from hotloop.detection.evaluate import evaluate_detection

    hp, problem, model = _setup(eval_examples=8)
    out = evaluate_detection(model, problem.reader("valid", hp), num_classes=3)
    assert out["examples"] == 8 and out["loss"] > 0 and "ppl" not in out
    assert 0.0 <= out["box_ap50"] <= 1.0 and "mask_ap" not in out
    assert model.training


def test_multiscale_stream_is_part_of_the_state_dict():
    sizes = (32, 64, 96)
    _, _, model = _setup(multiscale_sizes=sizes)
    batch = next(iter(DetectionShapes().reader("train", yolov3_tiny())))
    for _ in range(3):                                           # advance the stream
        model._maybe_rescale(batch)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ahead = [model._maybe_rescale(batch)["images"].shape[-1] for _ in range(8)]
    _, _, restored = _setup(multiscale_sizes=sizes)
    restored.load_state_dict(saved)
    assert [restored._maybe_rescale(batch)["images"].shape[-1] for _ in range(8)] == ahead
    assert len(set(ahead)) > 1                                   # the stream really varies the size
