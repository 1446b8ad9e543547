"""Metrics under data parallel: 2 gloo ranks, each evaluating its rows of every batch, report the
single-process values (a torchmetrics metric syncs its state; summed statistics are all-reduced)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torchmetrics.classification import MulticlassAUROC, MulticlassF1Score

from hotloop.engine.strategy import Strategy
from hotloop.models.conv import ConvNet, ConvNetHParams
from hotloop.problems.synthetic_images import SyntheticImages
from hotloop.train.metrics import MetricSpec
from hotloop.train.trainer import Trainer

pytestmark = pytest.mark.timeout(180)
WORLD = 2
HP = ConvNetHParams(image_size=8, image_channels=2, num_classes=5, conv_channels=(4, 8), batch_size=8,
                    train_examples=32, eval_examples=40, max_steps=1)


class Rows:
    """A plain metric object (no torch.distributed sync of its own): the rows this process saw."""

    def __init__(self) -> None:
        self.n = 0

    def update(self, target: torch.Tensor) -> None:
        self.n += target.shape[0]

    def compute(self) -> float:
        return float(self.n)

    def reset(self) -> None:
        self.n = 0


def class_scores(model, batch):
    logits, _ = model(batch)                             # [B, 1, K]
    return {"preds": logits[:, 0], "target": batch["targets"][:, 0]}   # [B, K], [B]


def evaluate(dist=None) -> dict[str, float]:
    torch.manual_seed(0)
    problem = SyntheticImages()
    trainer = Trainer(problem, ConvNet(HP, problem.spec(HP)), HP, strategy=Strategy(prefetch=0), loggers=[],
                      dist=dist, eval_step=class_scores,
                      metrics={"f1": MulticlassF1Score(num_classes=5, average="macro"),
                               "auroc": MulticlassAUROC(num_classes=5),
                               "rows": MetricSpec(Rows(), inputs=("target",))})
    return trainer.evaluate("valid")


def worker(rank: int, store_file: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from hotloop.parallel import ProcessGroupContext
    from hotloop.parallel.group import init_process_group
    init_process_group("gloo", timeout_s=60, store_file=store_file)
    result = evaluate(ProcessGroupContext("allreduce", 1.0))
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_two_ranks_report_the_single_process_metrics(tmp_path):
    single = evaluate()
    assert single["rows"] == HP.eval_examples
    mp.start_processes(worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=WORLD,
                       start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for got in ranks:
        assert got["f1"] == pytest.approx(single["f1"], abs=1e-6)
        assert got["auroc"] == pytest.approx(single["auroc"], abs=1e-6)
        assert got["rows"] == HP.eval_examples / WORLD     # a plain object computes over its own rows only
    assert 0 < single["f1"] < 1
