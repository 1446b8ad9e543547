"""The Precision object owns autocast and loss scaling; the one step uses it the same way in every phase."""
from __future__ import annotations

import pytest
import torch

from hotloop.engine import Strategy
from hotloop.engine.build import compile_step
from hotloop.engine.precision import Precision
from hotloop.compose.build import build_run

TINY = "image_size=32,gen_filters=4,disc_filters=4,gen_blocks=1,batch_size=2,pool_size=2,train_examples=16"


class RecordingScaler:
    """Stands in for torch.amp.GradScaler (CUDA only): records the calls, scales by 1."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self.calls.append("scale")
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append("unscale")

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append("step")
        optimizer.step()

    def update(self) -> None:
        self.calls.append("update")

    def state_dict(self) -> dict:
        return {"scale": 4.0}

    def load_state_dict(self, state: dict) -> None:
        self.calls.append(f"load {state['scale']}")


def test_autocast_and_pass_through_scaling_on_cpu() -> None:
    fp32, bf16 = Precision("fp32", "cpu"), Precision("bf16", "cpu")
    assert not fp32.scales_loss and not bf16.scales_loss
    a = torch.randn(4, 4)
    with bf16.autocast():
        assert (a @ a).dtype == torch.bfloat16
    with fp32.autocast():
        assert (a @ a).dtype == torch.float32
    assert Precision("fp16", "cpu").scaler is None                  # loss scaling is for CUDA
    assert fp32.state_dict() == {"precision": "fp32", "scaler": None}
    with pytest.raises(ValueError, match="choose one of"):
        Precision("fp8", "cpu")


def test_a_phased_step_scales_every_phase_and_updates_the_scale_once_per_step() -> None:
    run = build_run("shapes_unpaired", "cyclegan", "cyclegan_small", TINY + ",max_grad_norm=1.0")
    from hotloop.engine.build import build_step
    built = build_step(run.model, run.hp, Strategy(fused_optimizer=False))
    precision = Precision("fp32", "cpu")
    precision.scaler = RecordingScaler()
    step = compile_step(run.model, None, built.optimizer, Strategy(fused_optimizer=False),
                        phases=built.step.phases, phase_optimizers=built.step.phase_optimizers,
                        precision=precision, max_grad_norm=1.0)
    batch = next(iter(run.problem.reader("train", run.hp)))
    step([batch, batch])                                           # two micro-batches, two phases
    calls = precision.scaler.calls
    assert calls == ["scale", "scale", "unscale", "step"] * 2 + ["update"]
    precision.load_state_dict({"scaler": {"scale": 8.0}})
    assert calls[-1] == "load 8.0"
