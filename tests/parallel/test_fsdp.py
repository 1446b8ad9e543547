"""``data_parallel=fsdp`` (FSDP2) trains like DDP (gloo, 2 CPU processes).

A tiny BERT (2 blocks sharded as units, the tied embedding in the root) over 4 Adam
steps of 2 accumulated micro-batches with global-norm clipping that clips: losses,
gradient norms and final parameters equal DDP's within fp32 reduction-order tolerance
(rtol 1e-5: FSDP reduce-scatters where DDP all-reduces, so sums run in another order).
Also: one reduce-scatter per FSDP unit per optimizer step (none for the non-final
micro-batch), activation checkpointing bitwise equal to none (dropout on), the
non-finite check agreeing on both ranks when only one rank's shard is NaN, and the
Trainer's save/resume under FSDP (same world size, and its checkpoint in one process).
ZeRO-1 (`reduce`) under the skip policy restores its local optimizer state. One 2-process job
(spawned once per module) runs every distributed part.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hotloop.engine.activation_ckpt import block_units, set_activation_checkpointing
from hotloop.engine.build import compile_step
from hotloop.engine.strategy import Strategy
from hotloop.models.bert import BERT, BertHParams, BertLayer
from hotloop.models.conv import ConvNet, ConvNetHParams
from hotloop.optim import build_optimizer
from hotloop.problems.base import ProblemSpec
from hotloop.problems.synthetic_images import SyntheticImages
from hotloop.train.checkpoint import CheckpointManager, load_checkpoint
from hotloop.train.trainer import Trainer

WORLD = 2
STEPS = 4
ACCUM = 2
HP = BertHParams(hidden_size=16, num_layers=2, num_heads=2, filter_size=32, dropout=0.1,
                 attention_dropout=0.0, max_length=8, max_predictions=3, batch_size=8,
                 optimizer="adam", learning_rate=1e-2, max_grad_norm=0.05)
SPEC = ProblemSpec(task="pretrain", input_vocab_size=40, target_vocab_size=40, max_input_length=8,
                   max_target_length=3, pad_id=0)
TRAINER_HP = ConvNetHParams(image_size=8, image_channels=2, num_classes=5, conv_channels=(4, 8),
                            batch_size=8, optimizer="adam", learning_rate=1e-2, max_grad_norm=0.05,
                            accum_steps=2, train_examples=8 * 4, eval_examples=32)


def batches(rank: int, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` micro-batches of this rank's rows (4 of 8 per global batch)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(count):
        full = {"inputs": torch.randint(1, 40, (8, 8), generator=g),
                "segment_ids": torch.randint(0, 2, (8, 8), generator=g),
                "mlm_positions": torch.randint(0, 8, (8, 3), generator=g),
                "targets": torch.randint(1, 40, (8, 3), generator=g),
                "nsp_targets": torch.randint(0, 2, (8,), generator=g)}
        out.append({k: v[rank * 4:(rank + 1) * 4] for k, v in full.items()})
    return out


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def bert_run(rank: int, mode: str, *, checkpointing: bool = False, count_rs: bool = False,
             precision: str = "fp32", reshard: bool = True) -> dict[str, Any]:
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    from hotloop.parallel import ProcessGroupContext
    from hotloop.parallel.fsdp import FSDPConfig
    torch.manual_seed(0)
    model = BERT(HP, SPEC)
    set_activation_checkpointing(model, checkpointing)
    optimizer = build_optimizer(model.parameters(), HP)
    ctx = ProcessGroupContext(mode, 0.002, fsdp=FSDPConfig(precision, reshard))
    model, optimizer, no_sync = ctx.wrap(model, optimizer)
    calls = [0]

    class Counting(DefaultReduceScatter):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return super().__call__(*args, **kwargs)
    gathered_dtypes: set[str] = set()
    if mode == "fsdp":                     # the dtype a block computes with (its gathered parameters)
        block = ctx.routed.units[0]
        inner = block.forward
        block.forward = lambda *a, **k: (gathered_dtypes.add(str(block.qkv.weight.dtype)), inner(*a, **k))[1]
    if count_rs:
        for unit in ctx.routed.fsdp_modules():
            unit.set_custom_reduce_scatter(Counting())
    step = compile_step(model, None, optimizer, Strategy(precision=precision), max_grad_norm=HP.max_grad_norm,
                        no_sync=no_sync)
    torch.manual_seed(1 + rank)                                     # dropout masks per rank
    data, losses, norms, per_step = batches(rank, STEPS * ACCUM), [], [], []
    for i in range(STEPS):
        before = calls[0]
        result = step(data[i * ACCUM:(i + 1) * ACCUM])
        stats = ctx.all_reduce_stats(result.stats)
        losses.append(float(stats["nll_sum"] / stats["tokens"]))
        norms.append(float(result.grad_norm))
        per_step.append(calls[0] - before)
    out = {"losses": losses, "norms": norms, "params": full_params(model), "reduce_scatters": per_step,
           "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
           "gathered_dtypes": sorted(gathered_dtypes),
           "fsdp_modules": len(ctx.routed.fsdp_modules()) if mode == "fsdp" else 0}
    ctx.routed.unpatch()
    return out


def gathered_after_forward(rank: int, reshard: bool) -> int:
    """Parameters left gathered (plain tensors, not DTensor shards) between forward and backward."""
    from hotloop.parallel import ProcessGroupContext
    from hotloop.parallel.fsdp import FSDPConfig
    torch.manual_seed(0)
    model = BERT(HP, SPEC)
    ctx = ProcessGroupContext("fsdp", fsdp=FSDPConfig(reshard_after_forward=reshard))
    model, _, _ = ctx.wrap(model, build_optimizer(model.parameters(), HP))
    out = model.loss(batches(rank, 1)[0])
    count = sum(1 for p in model.parameters() if not hasattr(p, "to_local"))
    out.loss.backward()
    ctx.routed.unpatch()
    return count


def nonfinite_check(rank: int) -> dict[str, Any]:
    """Only rank 1's gradient shard is NaN: both ranks see a NaN global norm and both skip the update
    (no clipping here: a NaN clip factor would spread the NaN to every shard)."""
    from hotloop.engine.clipping import plain
    from hotloop.parallel import ProcessGroupContext
    from hotloop.train.nonfinite import NonFiniteGuard
    torch.manual_seed(0)
    model = BERT(HP, SPEC)
    ctx = ProcessGroupContext("fsdp")
    model, optimizer, _ = ctx.wrap(model, build_optimizer(model.parameters(), HP))
    guard = NonFiniteGuard("skip", optimizer, torch.device("cpu"))
    model.loss(batches(rank, 1)[0]).loss.backward()
    if rank == 1:
        next(model.parameters()).grad.to_local().view(-1)[0] = float("nan")
    start = full_params(model)
    norm = plain(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    optimizer.step()
    bad = guard.observe(0, torch.zeros(()), None)
    unchanged = all(torch.equal(start[n], p) for n, p in full_params(model).items())
    ctx.routed.unpatch()
    return {"norm_nan": bool(torch.isnan(norm)), "bad": bool(bad), "unchanged": unchanged}


def zero_skip_check(rank: int) -> bool:
    """ZeRO-1 under ``skip``: a NaN gradient (on rank 1's rows, averaged to both) leaves the
    parameters and this rank's partition of the Adam state as they were."""
    from hotloop.parallel import ProcessGroupContext
    from hotloop.train.nonfinite import NonFiniteGuard
    torch.manual_seed(0)
    model = BERT(HP, SPEC)
    ctx = ProcessGroupContext("reduce")
    model, optimizer, _ = ctx.wrap(model, build_optimizer(model.parameters(), HP))
    guard = NonFiniteGuard("skip", optimizer, torch.device("cpu"))
    for i, batch in enumerate(batches(rank, 2)):
        model.loss(batch).loss.backward()
        if i == 1:
            start = full_params(model)
            state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.optim.state.items()}
            if rank == 1:
                next(model.parameters()).grad.view(-1)[0] = float("nan")   # after DDP's all-reduce
                torch.distributed.all_reduce(next(model.parameters()).grad)
            else:
                torch.distributed.all_reduce(next(model.parameters()).grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    same_state = all(torch.equal(v, state[id(p)][k]) for p, s in optimizer.optim.state.items() for k, v in s.items())
    unchanged = all(torch.equal(start[n], p) for n, p in full_params(model).items())
    ctx.routed.unpatch()
    return bool(guard._grads_bad) and same_state and unchanged and len(state) > 0


def trainer_run(out: Path, max_steps: int, mode: str = "none", dist: Any = None) -> Trainer:
    torch.manual_seed(0)
    problem = SyntheticImages()
    model = ConvNet(TRAINER_HP, problem.spec(TRAINER_HP))
    strategy = Strategy(prefetch=0, data_parallel=mode, sync_every=2)
    return Trainer(problem, model, TRAINER_HP, strategy=strategy, output_dir=out, max_steps=max_steps,
                   eval_every=0, loggers=[], dist=dist)


def worker(rank: int, store_file: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from hotloop.parallel import ProcessGroupContext
    from hotloop.parallel.group import init_process_group
    init_process_group("gloo", timeout_s=60, store_file=store_file)
    out = Path(out_dir)
    results = {"ddp": bert_run(rank, "allreduce"), "fsdp": bert_run(rank, "fsdp", count_rs=True),
               "fsdp_ckpt": bert_run(rank, "fsdp", checkpointing=True), "nonfinite": nonfinite_check(rank),
               "fsdp_bf16": bert_run(rank, "fsdp", precision="bf16"),
               "fsdp_keep": bert_run(rank, "fsdp", reshard=False, count_rs=True),
               "gathered_after_forward": {r: gathered_after_forward(rank, r) for r in (True, False)},
               "zero_skip": zero_skip_check(rank)}
    trainer_run(out / "fsdp3", 3, "fsdp", ProcessGroupContext("fsdp")).fit()
    trainer_run(out / "fsdp5", 5, "fsdp", ProcessGroupContext("fsdp")).fit()
    trainer_run(out / "fsdp3", 5, "fsdp", ProcessGroupContext("fsdp")).fit(resume=True)
    gathered: list[Any] = [None] * WORLD
    torch.distributed.all_gather_object(gathered, results["nonfinite"])
    results["nonfinite"] = gathered
    both: list[Any] = [None] * WORLD
    torch.distributed.all_gather_object(both, results["zero_skip"])
    results["zero_skip"] = both
    if rank == 0:
        torch.save(results, out / "results.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)      # results are on disk; skip C++ teardown (see test_dp_equivalence.py)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fsdp")
    mp.start_processes(worker, args=(str(out / "rendezvous"), str(out)), nprocs=WORLD, start_method="spawn")
    return {"dir": out, **torch.load(out / "results.pt", weights_only=True)}


def test_block_units_are_bert_layers_and_tied_embedding_stays_in_root() -> None:
    model = BERT(HP, SPEC)
    assert [type(u) for u in block_units(model)] == [BertLayer, BertLayer]
    conv = ConvNet(TRAINER_HP, SyntheticImages().spec(TRAINER_HP))   # no ModuleList: top-level children
    assert block_units(conv) == [c for c in conv.children() if any(True for _ in c.parameters())]


@pytest.mark.timeout(180)
def test_fsdp_matches_ddp_with_clipping_and_accumulation(runs: dict) -> None:
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert max(ddp["norms"]) > HP.max_grad_norm                    # the clip is active
    torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fsdp["norms"], ddp["norms"], rtol=1e-5, atol=1e-6)
    assert fsdp["params"].keys() == ddp["params"].keys()
    for name, value in ddp["params"].items():
        torch.testing.assert_close(fsdp["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(180)
def test_accumulation_reduce_scatters_once_per_unit_per_step(runs: dict) -> None:
    fsdp = runs["fsdp"]
    assert fsdp["fsdp_modules"] == 3                               # 2 BertLayers + the root
    assert fsdp["reduce_scatters"] == [fsdp["fsdp_modules"]] * STEPS


@pytest.mark.timeout(180)
def test_activation_checkpointing_is_bitwise_equal(runs: dict) -> None:
    plain, ckpt = runs["fsdp"], runs["fsdp_ckpt"]
    assert ckpt["losses"] == plain["losses"] and ckpt["norms"] == plain["norms"]
    for name, value in plain["params"].items():
        assert torch.equal(ckpt["params"][name], value), name


@pytest.mark.timeout(180)
def test_keeping_parameters_gathered_after_forward_changes_nothing(runs: dict) -> None:
    keep, plain = runs["fsdp_keep"], runs["fsdp"]                   # reshard_after_forward=False vs True
    model = BERT(HP, SPEC)
    in_units = {id(p) for unit in block_units(model) for p in unit.parameters()}
    root_only = sum(1 for p in model.parameters() if id(p) not in in_units)    # embeddings, heads
    assert 0 < root_only < len(in_units)
    # resharding frees the units' gathered parameters; the root keeps its own until backward
    assert runs["gathered_after_forward"] == {True: root_only, False: len(list(model.parameters()))}
    assert keep["losses"] == plain["losses"] and keep["reduce_scatters"] == plain["reduce_scatters"]
    for name, value in plain["params"].items():
        assert torch.equal(keep["params"][name], value), name


@pytest.mark.timeout(180)
def test_bf16_computes_in_bf16_and_keeps_fp32_shards(runs: dict) -> None:
    """MixedPrecisionPolicy(bf16 params, fp32 reduce): the sharded parameters stay fp32 and the
    losses follow the fp32 run within bf16 rounding (about 3 significant digits)."""
    bf16, fp32 = runs["fsdp_bf16"], runs["fsdp"]
    assert bf16["param_dtypes"] == fp32["param_dtypes"] == ["torch.float32"]
    assert bf16["gathered_dtypes"] == ["torch.bfloat16"] and fp32["gathered_dtypes"] == ["torch.float32"]
    assert bf16["losses"] != fp32["losses"]                          # it did compute in bf16
    torch.testing.assert_close(bf16["losses"], fp32["losses"], rtol=2e-2, atol=0.0)


@pytest.mark.timeout(180)
def test_nonfinite_shard_on_one_rank_is_seen_by_both(runs: dict) -> None:
    assert runs["nonfinite"] == [{"norm_nan": True, "bad": True, "unchanged": True}] * WORLD


@pytest.mark.timeout(180)
def test_zero_skip_restores_parameters_and_local_state(runs: dict) -> None:
    assert runs["zero_skip"] == [True] * WORLD


def final_checkpoint(out: Path) -> dict:
    path = CheckpointManager(out / "checkpoints").latest()
    assert path is not None, f"no checkpoint in {out}"
    return load_checkpoint(path)


@pytest.mark.timeout(180)
def test_trainer_resume_under_fsdp(runs: dict, tmp_path: Path) -> None:
    resumed, straight = final_checkpoint(runs["dir"] / "fsdp3"), final_checkpoint(runs["dir"] / "fsdp5")
    assert resumed["meta"]["step"] == straight["meta"]["step"] == 5
    for key, value in straight["model"].items():
        assert torch.equal(resumed["model"][key], value), key      # same world size: bitwise
    assert sorted(resumed["optimizer"]["state"]) == sorted(straight["optimizer"]["state"])
    for index, state in straight["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["exp_avg_sq"], state["exp_avg_sq"])
    # the FSDP run's step-5 checkpoint is torch's plain layout: one process continues from it
    trainer = trainer_run(tmp_path, 6)
    trainer.fit(resume=CheckpointManager(runs["dir"] / "fsdp5" / "checkpoints").latest())
    assert trainer.step == 6


def one_process_run(checkpointing: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    from hotloop.engine.build import build_step
    torch.manual_seed(0)
    model = BERT(HP, SPEC)
    built = build_step(model, HP, Strategy(activation_checkpointing=checkpointing))
    assert any("activation checkpointing: 2 blocks" in line for line in built.step.report) == checkpointing
    torch.manual_seed(1)
    losses = [float(built.step(batches(0, 2)).loss) for _ in range(2)]
    return losses, full_params(model)


def test_activation_checkpointing_in_one_process_is_bitwise_equal() -> None:
    (plain_losses, plain), (ckpt_losses, ckpt) = one_process_run(False), one_process_run(True)
    assert ckpt_losses == plain_losses
    for name, value in plain.items():
        assert torch.equal(ckpt[name], value), name


def test_strategy_refuses_fsdp_where_it_cannot_run() -> None:
    from hotloop.errors import StrategyError
    for fields, needle in (({"backend": "graph"}, "backend=eager"), ({"precision": "fp16"}, "bf16")):
        with pytest.raises(StrategyError, match=needle):
            Strategy(data_parallel="fsdp", **fields).validate("cuda" if "precision" in fields else "cpu")
