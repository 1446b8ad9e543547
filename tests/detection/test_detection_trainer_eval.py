"""The Trainer and `hotloop eval` report COCO AP for detection runs."""
from __future__ import annotations

import torch

from hotloop.cli import main
from hotloop.engine import Strategy
from hotloop.train import Trainer
from hotloop.compose.build import build_run

torch.set_num_threads(1)


def test_trainer_evaluation_of_a_detection_run_reports_coco_ap(tmp_path, capsys):
    run = build_run("detection_shapes", "yolov3", "yolov3_tiny", "eval_examples=4,batch_size=2")
    trainer = Trainer(run.problem, run.model, run.hp, strategy=Strategy(prefetch=0), output_dir=tmp_path,
                      max_steps=2, loggers=[], run_info=run.info)
    result = trainer.fit()
    valid = result.metrics["valid"]
    assert {"loss", "box_ap", "box_ap50"} <= set(valid) and 0.0 <= valid["box_ap50"] <= 1.0
    assert main(["eval", "--output-dir", str(tmp_path), "--splits", "valid", "--device", "cpu"]) == 0
    assert "box_ap50=" in capsys.readouterr().out
