"""``--strategy auto`` with several processes picks DDP, ZeRO-1 or FSDP from the bytes a rank holds.

The byte counts and the decision rules run in this process; one ``hotloop train --nproc 2
--strategy auto`` run with a budget that only FSDP fits trains with FSDP and logs why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hotloop.models.bert import BERT, BertHParams
from hotloop.problems.base import ProblemSpec
from hotloop.tools.layout import LayoutBytes, decide, layout_bytes, optimizer_bytes_per_element

REPO = Path(__file__).resolve().parents[2]
HP = BertHParams(hidden_size=16, num_layers=2, num_heads=2, filter_size=32, max_length=8, max_predictions=3,
                 optimizer="adam")
SPEC = ProblemSpec(task="pretrain", input_vocab_size=40, target_vocab_size=40, max_input_length=8,
                   max_target_length=3, pad_id=0)


def test_layout_bytes_follow_each_layout() -> None:
    model = BERT(HP, SPEC)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert optimizer_bytes_per_element(HP) == 8                      # Adam: exp_avg, exp_avg_sq (fp32)
    assert optimizer_bytes_per_element(HP.replace(optimizer="sgd")) == 0
    sizes = layout_bytes(model, HP, 4)
    assert sizes["allreduce"] == LayoutBytes(params, params, 2 * params)
    assert sizes["reduce"] == LayoutBytes(params, params, params // 2)
    fsdp = sizes["fsdp"]
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == (params // 4, params // 4, params // 2)
    block = sum(p.numel() * 4 for p in model.layers[0].parameters())
    assert fsdp.gathered == 2 * (params - 2 * block) + 4 * block     # root whole step, 2 blocks at once
    assert sizes["allreduce"].total > sizes["reduce"].total


def test_decide_by_budget_then_by_measured_step() -> None:
    sizes = {"allreduce": LayoutBytes(100, 100, 200), "reduce": LayoutBytes(100, 100, 50),
             "fsdp": LayoutBytes(25, 25, 50, gathered=20)}
    assert decide(sizes, 150, {}) == ("fsdp", "only fsdp fits the budget (allreduce, reduce do not)")
    assert decide(sizes, 100, {})[0] == "fsdp"                       # none fits: the least memory
    assert "no layout fits" in decide(sizes, 100, {})[1]
    assert decide(sizes, 300, {"reduce": 10.0, "fsdp": 12.0})[0] == "reduce"
    assert decide(sizes, 1000, {"allreduce": 10.2, "reduce": 10.0, "fsdp": 9.0})[0] == "fsdp"
    assert decide(sizes, 1000, {"allreduce": 10.2, "reduce": 10.0, "fsdp": 10.0}) == (
        "allreduce", "allreduce, reduce, fsdp fit; allreduce has the fastest measured step "
        "(within 3% of the fastest, fewer collectives)")


@pytest.mark.timeout(150)
def test_auto_trains_with_fsdp_when_ddp_does_not_fit(tmp_path: Path) -> None:
    """The default problem's Transformer with 8 blocks (Adam): per rank DDP holds 5.2 MiB, ZeRO-1
    3.9 MiB, FSDP 3.4 MiB (0.8 MiB of it gathered), so a 3.6 MiB budget fits only FSDP."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "hotloop", "train", "--nproc", "2", "--max-steps", "2", "--eval-every", "0",
         "--override", "batch_size=8,train_examples=64,eval_examples=16,num_layers=4", "--strategy", "auto",
         "--strategy-override", f"prefetch=0,memory_budget_gb={3.6 / 1024}", "--output-dir", str(out)],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("allreduce       1.3      1.3        2.6       0.0       5.2    no",   # as docs/parallel.md shows
                "reduce          1.3      1.3        1.3       0.0       3.9    no",
                "fsdp            0.6      0.6        1.3       0.8       3.4   yes        -  <=="):
        assert row in proc.stdout, proc.stdout[-3000:]
    assert "chosen: data_parallel=fsdp (only fsdp fits the budget (allreduce, reduce do not))" in proc.stdout
    assert json.loads((out / "run.json").read_text())["strategy"]["data_parallel"] == "fsdp"
    assert "done: 2 steps" in proc.stdout


def test_fsdp_in_one_process_shards_over_a_one_rank_group(tmp_path: Path) -> None:
    """``data_parallel=fsdp`` without ``--nproc``: a one-rank process group, the model's parameters DTensors."""
    import torch

    from hotloop.compose.plan import StrategyRequest
    from hotloop.cli.cli_support import join_single_process_job
    from hotloop.models.conv import ConvNet, ConvNetHParams
    from hotloop.problems.synthetic_images import SyntheticImages
    from hotloop.train.trainer import Trainer
    assert join_single_process_job(StrategyRequest.parse("default", "data_parallel=allreduce")) is None
    request = StrategyRequest.parse("default", "data_parallel=fsdp,prefetch=0")
    job = join_single_process_job(request)
    try:
        hp = ConvNetHParams(image_size=8, image_channels=2, num_classes=5, conv_channels=(4, 8), batch_size=8,
                            optimizer="adam", train_examples=32, eval_examples=16)
        problem = SyntheticImages()
        model = ConvNet(hp, problem.spec(hp))
        trainer = Trainer(problem, model, hp, strategy=request.fixed(), output_dir=tmp_path, max_steps=2,
                          eval_every=0, loggers=[], dist=job.for_strategy(request.fixed()))
        assert trainer.fit().steps == 2
        assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
        saved = torch.load(next((tmp_path / "checkpoints").glob("*.ckpt")), weights_only=True)
        assert set(saved["model"]) == set(ConvNet(hp, problem.spec(hp)).state_dict())
    finally:
        job.close()
