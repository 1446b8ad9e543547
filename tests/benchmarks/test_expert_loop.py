"""The expert contender of ``benchmarks/zoo.py`` and ``benchmarks/lstm_ladder.py``
(``benchmarks/expert_loop.py``): it trains like the plain loop, and the zoo's JSON has its keys.

Tolerances: in fp32 the expert's foreach SGD, foreach clipping and set_to_none give the plain
loop's numbers bit for bit (same per-tensor arithmetic, grouped). ``channels_last`` convolutions
and the fused/foreach Adam kernels round differently: losses within 1e-5 relative over 6 steps.
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from expert_loop import ExpertLoop, ExpertSettings, PlainLoop, expert_precision, expert_settings  # noqa: E402

from hotloop.hparams import HParams  # noqa: E402
from hotloop.models.base import LossOutput  # noqa: E402
from hotloop.tools.hardware import HardwareInfo  # noqa: E402

pytestmark = pytest.mark.timeout(180)

FAST_CPU = HardwareInfo("cpu", 2, "test cpu", ("avx512_bf16",), cpu_isa=("avx2", "avx512", "avx512_bf16"))
AVX2 = HardwareInfo("cpu", 2, "zen 3", (), cpu_isa=("avx2",))
STEPS = 6
SGD = HParams(optimizer="sgd", learning_rate=0.1, max_grad_norm=0.5)
FP32_FOREACH = ExpertSettings(precision="fp32", optimizer="foreach")
CONV_REL = 1e-5       # channels_last convolutions / fused kernels: other rounding, same math


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def loss(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        logits = self.b(torch.tanh(self.a(batch["x"].flatten(1))))          # [B, 3]
        return LossOutput(F.cross_entropy(logits, batch["y"]), {})


class TinyConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.out = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4, 3)

    def loss(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        h = F.relu(self.norm(self.conv(batch["x"])))                        # [B, 4, 4, 4]
        return LossOutput(F.cross_entropy(self.out(h.mean((2, 3))), batch["y"]), {})


class TinyGAN(nn.Module):
    """Two phases with their own parameters, as CycleGAN has (``parameter_groups`` + ``<phase>_loss``)."""

    def __init__(self) -> None:
        super().__init__()
        self.g, self.d = nn.Linear(8, 8), nn.Linear(8, 1)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"g": list(self.g.parameters()), "d": list(self.d.parameters())}

    def g_loss(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        return LossOutput(-self.d(self.g(batch["x"].flatten(1))).mean(), {})

    def d_loss(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        fake = self.g(batch["x"].flatten(1)).detach()
        return LossOutput(self.d(fake).mean() - self.d(batch["x"].flatten(1)).mean(), {})


def _feed(seed: int = 0) -> Callable[[], dict[str, torch.Tensor]]:
    """The same batches for every loop: x [4, 2, 2, 2] (4-D, so channels_last applies), y [4]."""
    gen = torch.Generator().manual_seed(seed)
    batches = [{"x": torch.randn(4, 2, 2, 2, generator=gen), "y": torch.randint(0, 3, (4,), generator=gen)}
               for _ in range(3)]
    cycle = itertools.cycle(batches)
    return lambda: {k: v.clone() for k, v in next(cycle).items()}


def _pair(model_cls: type[nn.Module], hp: HParams, settings: ExpertSettings) -> tuple[PlainLoop, ExpertLoop]:
    torch.manual_seed(0)
    model = model_cls()
    twin = model_cls()
    twin.load_state_dict(model.state_dict())
    plain, expert = PlainLoop(model, hp, _feed()), ExpertLoop(twin, hp, _feed(), "cpu", settings)
    for _ in range(STEPS):
        plain.step()
        expert.step()
    expert.flush()
    return plain, expert


def _params(loop: PlainLoop | ExpertLoop) -> list[torch.Tensor]:
    return [p.detach() for p in loop.model.parameters()]


@pytest.mark.parametrize("model_cls", [TinyMLP, TinyGAN], ids=["one-loss", "phased"])
def test_expert_fp32_foreach_sgd_is_bitwise_the_plain_loop(model_cls):
    plain, expert = _pair(model_cls, SGD, FP32_FOREACH)
    assert expert.optimizer_kinds == {name: "foreach" for name in expert.optimizers}
    assert len(plain.losses) == len(expert.losses) == STEPS
    assert plain.losses == expert.losses
    assert all(torch.equal(a, b) for a, b in zip(_params(plain), _params(expert)))


@pytest.mark.parametrize("optimizer,mode", [("adam", "foreach"), ("adam", "fused"), ("sgd", "fused")])
def test_expert_fp32_multi_tensor_kernels_match_the_plain_loop(optimizer, mode):
    plain, expert = _pair(TinyMLP, SGD.replace(optimizer=optimizer, learning_rate=1e-2),
                          ExpertSettings(precision="fp32", optimizer=mode))
    assert expert.optimizer_kinds == {"all": mode}          # torch has fused CPU kernels for both
    assert expert.losses == pytest.approx(plain.losses, rel=CONV_REL)


def test_expert_conv_model_runs_channels_last_and_matches_within_rounding():
    settings = expert_settings(TinyConv(), "cpu", "fp32")
    assert settings.channels_last and settings.precision == "fp32" and settings.optimizer == "fused"
    plain, expert = _pair(TinyConv, SGD, settings)
    assert expert.model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert expert.losses == pytest.approx(plain.losses, rel=CONV_REL)
    assert not expert_settings(TinyMLP(), "cpu", "fp32").channels_last


def test_expert_reads_the_loss_once_per_block():
    _, expert = _pair(TinyMLP, SGD, FP32_FOREACH)
    expert.step()
    expert.step()
    assert len(expert.losses) == STEPS and len(expert.pending) == 2     # kept on the device until flush
    expert.flush()
    assert len(expert.losses) == STEPS + 2 and not expert.pending


def test_expert_uses_bf16_only_where_the_hardware_has_fast_bf16():
    assert expert_precision("cpu", "auto", FAST_CPU) == "bf16"
    assert expert_precision("cpu", "auto", AVX2) == "fp32"
    assert expert_precision("cpu", "fp32", FAST_CPU) == "fp32"
    with pytest.raises(ValueError):
        expert_precision("cpu", "bf16", FAST_CPU)
    settings = expert_settings(TinyMLP(), "cpu", "auto", hardware=FAST_CPU)
    assert settings.precision == "bf16"
    dtypes: list[torch.dtype] = []
    plain, expert = _pair(TinyMLP, SGD, settings)
    expert.model.a.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    expert.step()
    assert dtypes == [torch.bfloat16]                               # the forward autocasts
    assert expert.model.a.weight.dtype == torch.float32             # master weights stay fp32
    assert expert.losses[:STEPS] == pytest.approx(plain.losses, rel=3e-2)


@pytest.mark.slow
def test_expert_compiled_trains_like_the_plain_loop():
    """``torch.compile`` of the loss (inductor, about 10-20 s to compile on 2 cores): same losses
    within rounding; the first step's time is kept apart as the compile time."""
    from hotloop.ops.cpu_isa import cpu_isa
    if "avx512" not in cpu_isa().usable:
        # torch 2.13's inductor vectorising for AVX2 (ATEN_CPU_CAPABILITY=avx2 on the AVX512-BF16
        # EPYC) compiled this MLP into losses 5% off the plain loop's (and a kernel failing its own
        # bounds check in tests/engine/test_engine_optim_explain.py): torch's compiler, not the loop
        pytest.skip("inductor's AVX2 kernels miscompile this model under the AVX2 caps (torch 2.13)")
    plain, expert = _pair(TinyMLP, SGD, ExpertSettings(precision="fp32", optimizer="foreach", compile=True))
    assert expert.compile_seconds > 0
    assert expert.losses == pytest.approx(plain.losses, rel=CONV_REL)


def test_zoo_smoke_run_writes_every_key(tmp_path, monkeypatch):
    """One zoo model at its smallest batch, fp32: the naive, expert and hotloop columns and the JSON keys."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    import zoo
    moved: list[str] = []
    real_perturb = zoo.perturb_weights
    monkeypatch.setattr(zoo, "perturb_weights", lambda model, precision: (moved.append(precision),
                                                                          real_perturb(model, precision)))
    carried: list[Any] = []
    real_untimed = zoo.train_untimed
    monkeypatch.setattr(zoo, "train_untimed", lambda loop, steps, flags=None: (carried.append(loop),
                                                                               real_untimed(loop, steps, flags)))
    out = tmp_path / "zoo.json"
    assert zoo.main(["--smoke", "--models", "se_resnext50", "--tune-seconds", "0", "--block", "1",
                     "--precision", "fp32", "--control", "--quality-steps", "4", "--quality-window", "3",
                     "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for key in ("cpu", "amx", "device", "rows", "geomean_speedup",                  # today's keys
                "geomean_vs_naive", "geomean_vs_expert", "precision", "cpu_flags", "machine"):
        assert key in data, key
    assert data["precision"] == "fp32" and data["geomean_speedup"] == data["geomean_vs_naive"]
    assert set(data["cpu_flags"]) >= {"isa", "caps"}
    row = data["rows"][0]
    for key in ("model", "batch", "input_size", "plain_samples_per_s", "hotloop_samples_per_s", "speedup",
                "mfu", "expert_samples_per_s", "speedup_vs_naive", "speedup_vs_expert", "settings",
                "plain_loss", "expert_loss", "hotloop_loss"):
        assert key in row, key
    assert row["speedup"] == row["speedup_vs_naive"]
    assert set(row["settings"]) == {"plain", "expert", "hotloop"}
    assert row["settings"]["expert"]["precision"] == "fp32" and row["settings"]["expert"]["channels_last"]
    assert row["settings"]["hotloop"]["precision"] == "fp32"
    assert row["control_vs_expert"] > 0 and row["control_paired"]["verdict"] == "unpaired"   # one round
    assert data["geomean_control"] == row["control_vs_expert"] and "unpaired" in data["verdicts_control"]
    assert 0 <= row["control_loss_rel_diff"] < 1e-3    # four steps from weights one ulp away
    assert 0 <= row["naive_floor_rel_diff"] < 1e-3
    assert moved == ["fp32", "fp32"]                     # the twins, and only they, start one ulp away
    # two timed steps each (warm-up and one round of one), two more untimed; the loss: the last three
    assert (row["steps_each"], row["quality_steps"], row["quality_window"]) == (2, 4, 3)
    assert len(carried) == 5 and all(len(loop.losses) == 4 for loop in carried)   # every contender, 4 steps
    for key in ("plain", "expert", "hotloop", "expert_twin", "plain_twin"):
        assert row[f"{key}_loss"] > 0, key


def test_ladder_expert_rung_is_the_plain_loop_with_the_expert_lines(monkeypatch):
    import lstm_rungs
    from hotloop.engine.strategy import Strategy
    for precision in ("fp32", "bf16"):
        monkeypatch.setattr(lstm_rungs, "expert_precision", lambda device, _p=precision: _p)
        rung = lstm_rungs.expert_rung()
        assert rung.name.startswith(lstm_rungs.EXPERT_PREFIX) and precision in rung.name
        assert (rung.precision, rung.foreach, rung.grads_to_none, rung.sync_every_step) == (precision, True, True, False)
        assert not (rung.fused_kernel_ce or rung.model_loss or rung.formulation or rung.prefetch or rung.cumulative)
        assert rung.threads == 0 and rung.strategy is None                   # torch's threads, no hotloop
    rungs = lstm_rungs.ladder_rungs(2, Strategy(), with_compile=False)
    assert sum(r.name.startswith(lstm_rungs.EXPERT_PREFIX) for r in rungs) == 1
    assert rungs[-1].name.startswith("hotloop")                             # the summary reads the last row


def test_expert_reads_with_workers_and_pinned_copies_on_an_accelerator_only():
    """On a GPU the expert reads as ``DataLoader(num_workers=4, pin_memory=True)`` would; on a CPU
    worker processes would take the step's cores, so it reads on the training thread."""
    from expert_loop import ACCELERATOR_DATA_WORKERS
    gpu = expert_settings(TinyMLP(), "cuda", "fp32", hardware=FAST_CPU)
    assert (gpu.data_workers, gpu.pin_memory) == (ACCELERATOR_DATA_WORKERS, True) and ACCELERATOR_DATA_WORKERS > 0
    cpu = expert_settings(TinyMLP(), "cpu", "fp32", hardware=FAST_CPU)
    assert (cpu.data_workers, cpu.pin_memory) == (0, False)
    assert {"data_workers", "pin_memory"} <= set(gpu.to_dict())       # the zoo's JSON names them
