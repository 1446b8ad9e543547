"""The proposal rules on synthetic and real model structures."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hotloop.tools.hardware import HardwareInfo
from hotloop.tools.model_facts import ModelFacts, analyze_model, count_layers
from hotloop.tools.proposals import ReaderFacts, combine, propose

CPU_BF16 = HardwareInfo("cpu", 2, "test cpu", ("avx512_bf16",))
CPU_PLAIN = HardwareInfo("cpu", 1, "old cpu", ())
AMPERE = HardwareInfo("cuda", 8, "host", (), "A100", (8, 0))


def facts(share: dict, *, ops: int = 100, flops: float = 1e10, sparse: int = 0, conv2d: bool = False
          ) -> ModelFacts:
    return ModelFacts("m.M", 1000, {"linear": 1}, sparse, conv2d, flops, ops, share)


def labels(proposals) -> set[str]:
    return {p.label for p in proposals}


def test_conv_heavy_proposes_channels_last_and_cudnn_benchmark_on_cuda():
    conv = facts({"conv": 0.8, "matmul": 0.1, "other": 0.1}, conv2d=True)
    assert "channels_last" in labels(propose(conv, CPU_PLAIN))
    assert "cudnn_benchmark" not in labels(propose(conv, CPU_PLAIN))
    on_gpu = propose(conv, AMPERE)
    assert {"channels_last", "cudnn_benchmark", "tf32"} <= labels(on_gpu)     # TF32 covers cuDNN's convs too
    assert "convolutions" in next(p.rule for p in on_gpu if p.label == "tf32")
    assert "tf32" not in labels(propose(conv, AMPERE, allow_reduced_precision=False))
    rule = next(p.rule for p in on_gpu if p.label == "channels_last")
    assert "80% of FLOPs in 2-D convolutions" in rule


def test_channels_last_is_timed_from_a_third_of_the_flops_in_convs():
    """mask_rcnn_shapes has 45% of its FLOPs in convolutions (the rest in its box-head matmuls)."""
    assert "channels_last" in labels(propose(facts({"conv": 0.45, "matmul": 0.55}, conv2d=True), CPU_PLAIN))
    assert "channels_last" not in labels(propose(facts({"conv": 0.2, "matmul": 0.8}, conv2d=True), CPU_PLAIN))
    assert "cudnn_benchmark" not in labels(propose(facts({"conv": 0.45, "matmul": 0.55}, conv2d=True), AMPERE))


def test_the_fused_update_is_also_timed_in_channels_last_where_that_layout_is_proposed():
    """Its gain alone is about 1% of a conv net's step: judged beside channels_last alone, in the same rounds."""
    conv = propose(facts({"conv": 0.8, "matmul": 0.2}, conv2d=True), CPU_PLAIN)
    both = next(p for p in conv if p.label == "fused_optimizer in channels_last")
    assert both.changes == {"fused_optimizer": True, "fused_kernel": True, "channels_last": True}
    assert {"fused_optimizer", "channels_last"} <= labels(conv)            # each is still timed alone
    assert "fused_optimizer in channels_last" not in labels(propose(facts({"matmul": 1.0}), CPU_PLAIN))
    sparse = propose(facts({"conv": 0.8, "matmul": 0.2}, conv2d=True, sparse=1), CPU_PLAIN)
    assert "fused_optimizer in channels_last" not in labels(sparse)


def test_matmul_heavy_proposes_bf16_only_on_fast_bf16_hardware():
    mm = facts({"matmul": 0.9, "other": 0.1})
    bf16 = next(p for p in propose(mm, CPU_BF16) if p.label == "bf16")
    assert bf16.changes == {"precision": "bf16"} and "avx512_bf16" in bf16.rule
    assert "bf16" not in labels(propose(mm, CPU_PLAIN))
    assert {"bf16", "tf32"} <= labels(propose(mm, AMPERE))


def test_sparse_embeddings_block_the_fused_optimizer():
    assert "fused_optimizer" in labels(propose(facts({"matmul": 1.0}), CPU_PLAIN))
    assert "fused_optimizer" not in labels(propose(facts({"matmul": 1.0}, sparse=1), CPU_PLAIN))


def test_many_small_ops_propose_fewer_threads_only_with_several_cores():
    small = facts({"matmul": 1.0}, ops=2000, flops=2e8)       # 0.1 MFLOP per op
    big = facts({"matmul": 1.0}, ops=50, flops=5e10)
    threads = next(p for p in propose(small, CPU_BF16) if p.label == "threads=1")
    assert threads.changes["intra_op_threads"] == 1 and "small ops" in threads.rule
    assert "threads=1" not in labels(propose(big, CPU_BF16))
    assert "threads=1" not in labels(propose(small, CPU_PLAIN))   # one core: nothing to reduce


def test_capture_backends_are_proposed_only_when_the_engine_declares_them():
    small = facts({"matmul": 1.0}, ops=2000, flops=2e8)
    assert not any(p.label.startswith("backend=") for p in propose(small, CPU_BF16))
    declared = propose(small, CPU_BF16, available_backends=("graph",))
    assert "backend=graph" in labels(declared) and "backend=inductor" not in labels(declared)


def test_data_bound_reader_proposes_workers_and_prefetch_untimed():
    mm = facts({"matmul": 1.0})
    slow = propose(mm, CPU_BF16, ReaderFacts(seconds_per_batch=0.015, step_seconds=0.02))
    workers = next(p for p in slow if p.label == "more workers")
    assert not workers.timed and workers.changes["num_workers"] >= 1
    assert workers.changes["prefetch"] >= 2 and "data-bound" in workers.rule
    mild = propose(mm, CPU_BF16, ReaderFacts(seconds_per_batch=0.002, step_seconds=0.02))
    assert "prefetch" in labels(mild) and "more workers" not in labels(mild)
    fast = propose(mm, CPU_BF16, ReaderFacts(seconds_per_batch=1e-5, step_seconds=0.02))
    assert not {"prefetch", "more workers"} & labels(fast)


def test_combine_merges_timed_changes_and_skips_conflicts():
    mm = facts({"matmul": 0.9, "other": 0.1}, ops=2000, flops=2e8)
    proposals = propose(mm, CPU_BF16, ReaderFacts(0.015, 0.02))
    merged = combine(proposals)
    assert merged is not None
    assert merged.changes["precision"] == "bf16" and merged.changes["fused_optimizer"] is True
    assert "num_workers" not in merged.changes              # untimed pipeline knobs stay out


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))   # [B, 16, H, W]
        return self.head(y.mean(dim=(2, 3)))                    # [B, 4]


class _Out:
    def __init__(self, loss):
        self.loss = loss


def test_measured_structures_drive_the_rules():
    torch.manual_seed(0)
    net = ConvNet()
    layers, sparse, conv2d = count_layers(net)
    assert layers["conv"] == 2 and layers["linear"] == 1 and conv2d and sparse == 0
    batch = {"inputs": torch.randn(4, 3, 16, 16), "targets": torch.randint(0, 4, (4,))}
    conv_facts = analyze_model(net, batch, loss_fn=lambda m, b, s: _Out(
        nn.functional.cross_entropy(m(b["inputs"]), b["targets"])))
    assert conv_facts.flop_share["conv"] > 0.9 and conv_facts.ops_per_step > 0
    assert "channels_last" in labels(propose(conv_facts, CPU_BF16))
    assert all(p.grad is None for p in net.parameters())      # measured on a copy

    mlp = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 8))
    emb = nn.Embedding(10, 256, sparse=True)
    _, sparse, _ = count_layers(nn.ModuleList([mlp, emb]))
    assert sparse == 1
    mm_facts = analyze_model(mlp, {"inputs": torch.randn(64, 256), "targets": torch.randint(0, 8, (64,))},
                             loss_fn=lambda m, b, s: _Out(nn.functional.cross_entropy(m(b["inputs"]), b["targets"])))
    assert mm_facts.flop_share["matmul"] > 0.9
    assert "bf16" in labels(propose(mm_facts, CPU_BF16))


def test_shared_cores_propose_fewer_threads_even_for_big_ops():
    big = facts({"matmul": 1.0}, ops=50, flops=5e10)
    busy = next(p for p in propose(big, CPU_BF16, load=5.0) if p.label.startswith("threads="))
    assert busy.changes["intra_op_threads"] == 1 and "shared cores" in busy.rule
    assert not any(p.label.startswith("threads=") for p in propose(big, CPU_BF16, load=1.0))


def test_conv_heavy_on_fast_bf16_hardware_also_proposes_bf16():
    conv = facts({"conv": 0.9, "other": 0.1}, conv2d=True)
    bf16 = next(p for p in propose(conv, CPU_BF16) if p.label == "bf16")
    assert "conv-heavy" in bf16.rule
    assert "bf16" not in labels(propose(conv, CPU_PLAIN))


def test_parity_tolerance_is_bitwise_unless_threads_or_precision_change():
    from hotloop.engine.parity import REFERENCE
    from hotloop.engine.strategy import Strategy
    from hotloop.tools.autotune import THREADS_TOL, parity_tolerance
    cpu = torch.device("cpu")
    assert parity_tolerance(REFERENCE.replace(fused_optimizer=True), REFERENCE, cpu) == 0.0
    assert parity_tolerance(REFERENCE.replace(fused_optimizer=True), REFERENCE, cpu, "momentum") == 0.0
    # foreach Adam orders its arithmetic differently from the per-tensor loop
    assert parity_tolerance(REFERENCE.replace(fused_optimizer=True), REFERENCE, cpu, "adam") == THREADS_TOL
    assert parity_tolerance(REFERENCE.replace(intra_op_threads=1), REFERENCE, cpu) == THREADS_TOL
    assert parity_tolerance(Strategy(precision="bf16"), REFERENCE, cpu) == 3e-2



def test_large_op_models_get_no_capture_proposal():
    """Compiling is proposed for many small ops only: on a large-op transformer step a 60 s inductor
    candidate cannot be timed within a short budget, and as part of the combined candidate it kept
    the measurable bf16 + fused-optimizer combination from being timed (Multi30k, 2026-11-30)."""
    attention = ModelFacts("m.M", 1000, {"linear": 8, "attention": 4, "norm": 8}, 0, False, 2e11, 3000,
                           {"matmul": 1.0})
    assert not any(p.label.startswith("backend=") for p in
                   propose(attention, CPU_BF16, available_backends=("graph", "inductor")))


def test_compiling_backends_are_proposed_when_the_planned_run_repays_the_compile():
    big = facts({"conv": 1.0}, ops=50, flops=5e10)           # few large ops: not a "many small ops" model
    both = ("graph", "inductor")
    assert not any(p.label.startswith("backend=") for p in propose(big, CPU_PLAIN, available_backends=both,
                                                                   planned_seconds=30.0))   # 5% < 2 s
    long_run = {p.label: p for p in propose(big, CPU_PLAIN, available_backends=both, planned_seconds=1000.0)}
    assert {"backend=graph", "backend=inductor"} <= set(long_run)   # 5% of 1000 s repays the 40 s default
    assert long_run["backend=inductor"].compile_cost == 40.0 and "repays" in long_run["backend=inductor"].rule
    short = labels(propose(big, CPU_PLAIN, available_backends=both, planned_seconds=100.0))
    assert "backend=graph" in short and "backend=inductor" not in short       # 5 s repays 2 s, not 40 s
    cached = {p.label: p for p in propose(big, CPU_PLAIN, available_backends=both, planned_seconds=100.0,
                                          compile_costs={"inductor": 2.5})}
    assert "backend=inductor" in cached and cached["backend=inductor"].compile_cost == 2.5


def test_compile_prices_remember_cold_and_cached_compiles(tmp_path, monkeypatch):
    from hotloop.engine.compile_cache import CompileStats
    from hotloop.tools.compile_prices import CACHED_FRACTION, compile_price, record_compile
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    key = {"model": "MLP", "shapes": [[4, 8]]}
    assert compile_price(key, "inductor", 40.0) == (40.0, "not compiled here before")
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "fxgraph").mkdir()                  # the compile cache holds code
    record_compile(key, "inductor", CompileStats(80.0, {"fxgraph_cache_miss": 2}))
    assert compile_price(key, "inductor", 40.0)[0] == CACHED_FRACTION * 80.0
    record_compile(key, "inductor", CompileStats(3.0, {"fxgraph_cache_hit": 2}))
    assert compile_price(key, "inductor", 40.0) == (3.0, "cached compile (measured)")
    assert compile_price({**key, "shapes": [[8, 8]]}, "inductor", 40.0)[0] == 40.0   # another shape: unknown
    (tmp_path / "inductor" / "fxgraph").rmdir()
    assert compile_price(key, "inductor", 40.0) == (40.0, "the compile cache folder is gone")
    next(tmp_path.joinpath("compile").iterdir()).write_text("{not json")
    assert compile_price(key, "inductor", 40.0)[0] == 40.0      # an unreadable record is ignored


def test_cold_compile_is_priced_by_the_step_op_count(tmp_path, monkeypatch):
    from hotloop.engine.compile_cache import CompileStats
    from hotloop.tools.compile_prices import (CACHED_FRACTION, COLD_FIXED_SECONDS, COLD_SECONDS_PER_OP,
                                              cold_compile_price, next_compile_prices, record_compile)
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert cold_compile_price(10, 40.0) == 40.0                       # a small graph pays the floor
    big = COLD_FIXED_SECONDS + COLD_SECONDS_PER_OP * 4000
    assert cold_compile_price(4000, 40.0) == big > cold_compile_price(2000, 40.0) > 40.0
    key = {"model": "Big", "shapes": [[4, 8]]}
    assert next_compile_prices(key, 4000) == {"inductor": big}
    (tmp_path / "inductor" / "fxgraph").mkdir(parents=True)     # its code is now in the compile cache
    record_compile(key, "inductor", CompileStats(90.0, {"fxgraph_cache_miss": 2}))
    assert next_compile_prices(key, 4000) == {"inductor": CACHED_FRACTION * 90.0}


def test_the_op_price_covers_every_measured_cold_compile():
    """``docs/data/compile_price.json`` (benchmarks/compile_price.py): no zoo model's cold compile took
    longer than its price, and a cached load no longer than CACHED_FRACTION of the cold compile."""
    import json
    from pathlib import Path

    from hotloop.tools.compile_prices import (CACHED_FRACTION, COLD_FIXED_SECONDS, COLD_SECONDS_PER_OP,
                                              cold_compile_price)
    from hotloop.tools.proposals import COMPILE_COSTS
    data = json.loads((Path(__file__).resolve().parents[2] / "docs/data/compile_price.json").read_text())
    assert len(data["rows"]) >= 5
    for row in data["rows"]:
        assert row["cold_s"] <= cold_compile_price(row["ops_per_step"], COMPILE_COSTS["inductor"]), row["model"]
        assert row["cached_was_cached"] and row["cached_s"] <= CACHED_FRACTION * row["cold_s"], row["model"]
    assert COLD_FIXED_SECONDS == pytest.approx(data["price_fixed_s"], rel=0.05)     # the fitted line, rounded
    assert COLD_SECONDS_PER_OP == pytest.approx(data["price_seconds_per_op"], rel=0.05)


def test_a_phased_model_gets_inductor_only():
    from hotloop.compose.build import build_run
    from hotloop.tools.autotune import _engine_backends
    gan = build_run("shapes_unpaired", "cyclegan", "cyclegan_small",
                    "image_size=32,gen_filters=4,disc_filters=4,gen_blocks=1,batch_size=2").model
    assert _engine_backends(gan) == ("inductor",)          # its networks compiled one by one
    assert _engine_backends(nn.Linear(2, 2)) == ("graph", "inductor")
