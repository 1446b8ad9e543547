"""N ranks x B/N rows train exactly like one process with B rows (gloo, 2 CPU processes).

Both modes (allreduce, reduce), gradient accumulation with ``no_sync``,
global-norm clipping that actually clips, several gradient buckets; a conv
classifier and a streamed LSTM LM carrying its state. Also: a Reduce-mode
checkpoint resumes in one process, a one-process checkpoint resumes on two
ranks, and Reduce mode keeps about half the optimizer state per rank. The
same through the Trainer (``dist=ProcessGroupContext``), with its checkpoint files.
One 2-process job (spawned once per module) runs every distributed part.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from hotloop.data import stream_windows
from hotloop.engine.build import compile_step
from hotloop.engine.strategy import Strategy
from hotloop.models.formulation import Formulation
from hotloop.models.conv import ConvNet, ConvNetHParams
from hotloop.models.lstm_lm import LSTMLM, LSTMLMHParams
from hotloop.optim import build_optimizer
from hotloop.problems.base import Problem, ProblemSpec
from hotloop.problems.synthetic_images import SyntheticImages
from hotloop.train.checkpoint import CheckpointManager, load_checkpoint
from hotloop.train.trainer import Trainer

WORLD = 2
STEPS = 3        # steps before and after the checkpoint
BUCKET_MB = 0.002  # ~500 floats: several buckets and owner segments per backward


@dataclass
class Case:
    name: str
    hp: Any
    make_model: Callable[[], torch.nn.Module]
    make_reader: Callable[[], Any]
    accum: int


def conv_case() -> Case:
    hp = ConvNetHParams(image_size=8, image_channels=2, num_classes=5, conv_channels=(4, 8),
                        batch_size=8, optimizer="adam", learning_rate=1e-2, adam_epsilon=1e-8,
                        max_grad_norm=0.05, train_examples=8 * 40)
    problem = SyntheticImages()
    spec = problem.spec(hp)
    return Case("conv", hp, lambda: ConvNet(hp, spec), lambda: problem.reader("train", hp), accum=2)


def lstm_case_spec() -> ProblemSpec:
    return ProblemSpec(task="lm", input_vocab_size=20, target_vocab_size=20, max_input_length=5,
                       max_target_length=5, streamed=True, pad_id=-1)


def lstm_tokens() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 20, size=4 * 80).astype(np.int32)


def lstm_case() -> Case:
    hp = LSTMLMHParams(hidden_size=8, num_layers=2, batch_size=4, max_length=5, optimizer="sgd",
                       learning_rate=1.0, max_grad_norm=0.5, init_scale=0.1)
    spec, tokens = lstm_case_spec(), lstm_tokens()

    def make_model() -> LSTMLM:                 # the fused output+CE formulation, as auto may pick it
        model = LSTMLM(hp, spec)
        model.use_formulation(Formulation(fused_ce=True))
        return model
    return Case("lstm", hp, make_model, lambda: stream_windows(tokens, 4, 5), accum=1)


def train(case: Case, ctx: Any, steps: int, init: dict | None = None) -> dict:
    """``steps`` optimizer steps from a fixed seed (or from checkpoint ``init``)."""
    torch.manual_seed(0)
    model = case.make_model()
    optimizer = build_optimizer(model.parameters(), case.hp)
    reader = case.make_reader()
    if init is not None:
        init = copy.deepcopy(init)  # load_state_dict may alias the tensors an optimizer then updates
        model.load_state_dict(init["model"])
        optimizer.load_state_dict(init["optim"])
        reader.load_state_dict(init["reader"])
    no_sync = None
    if ctx is not None:
        model, optimizer, no_sync = ctx.wrap(model, optimizer)
        reader = ctx.shard_reader(reader)
    step = compile_step(model, None, optimizer, Strategy(), max_grad_norm=case.hp.max_grad_norm,
                        no_sync=no_sync)
    batches, state, losses, norms = iter(reader), None, [], []
    for _ in range(steps):
        result = step([next(batches) for _ in range(case.accum)], state)
        state = result.state
        stats = ctx.all_reduce_stats(result.stats) if ctx is not None else result.stats
        losses.append(float(stats["nll_sum"] / stats["tokens"]))
        norms.append(float(result.grad_norm))
    optim = ctx.consolidate_optimizer_state(optimizer) if ctx is not None else optimizer.state_dict()
    return {"losses": losses, "grad_norms": norms, "optim": optim, "reader": reader.state_dict(),
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def worker(rank: int, store_file: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from hotloop.parallel import ProcessGroupContext, optimizer_state_bytes
    from hotloop.parallel.group import init_process_group
    init_process_group("gloo", timeout_s=60, store_file=store_file)   # a file: no port to race for
    results = {}
    for case in (conv_case(), lstm_case()):
        start = torch.load(Path(out_dir) / f"{case.name}_start.pt", weights_only=True)
        for mode in ("allreduce", "reduce"):
            first = train(case, ProcessGroupContext(mode, BUCKET_MB), STEPS)
            resumed = train(case, ProcessGroupContext(mode, BUCKET_MB), STEPS, init=start)
            results[f"{case.name}/{mode}"] = {"first": first, "resumed": resumed}
        ctx = ProcessGroupContext("reduce", BUCKET_MB)
        torch.manual_seed(0)
        model = case.make_model()
        _, sharded, _ = ctx.wrap(model, build_optimizer(model.parameters(), case.hp))
        train_step = compile_step(model, None, sharded, Strategy())
        train_step([next(iter(ctx.shard_reader(case.make_reader())))])
        results[f"{case.name}/state_bytes"] = torch.tensor(optimizer_state_bytes(sharded))
    for mode in ("allreduce", "reduce"):  # the Trainer: 3 steps, and 1 process's step-3 checkpoint to 5
        trainer_run(Path(out_dir, mode), 3, mode, ProcessGroupContext(mode, BUCKET_MB)).fit()
        trainer_run(Path(out_dir, f"{mode}-from-1"), 5, mode,
                    ProcessGroupContext(mode, BUCKET_MB)).fit(resume=Path(out_dir, "single-3.ckpt"))
        lstm_trainer_run(Path(out_dir, f"lstm-{mode}"), 4, mode, ProcessGroupContext(mode, BUCKET_MB)).fit()
    gathered = [None] * WORLD
    torch.distributed.all_gather_object(gathered, {k: v for k, v in results.items()
                                                   if k.endswith("state_bytes")})
    if rank == 0:
        results["state_bytes_per_rank"] = {k: [g[k] for g in gathered] for k in gathered[0]}
        torch.save(results, Path(out_dir) / "results.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # Results are on disk. Skip C++ static destructors: about 1 run in 4, a gloo/DDP
    # thread still joinable at interpreter teardown aborted the worker after it had
    # finished (SIGABRT, "terminate called without an active exception", no Python frame).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


TRAINER_HP = ConvNetHParams(image_size=8, image_channels=2, num_classes=5, conv_channels=(4, 8),
                            batch_size=8, optimizer="adam", learning_rate=1e-2, max_grad_norm=0.05,
                            accum_steps=2, train_examples=8 * 4, eval_examples=32)


def trainer_run(out: Path, max_steps: int, mode: str = "none", dist: Any = None) -> Trainer:
    """2 steps per epoch (4 batches, accum 2), so 3 steps cross an epoch boundary."""
    torch.manual_seed(0)
    problem = SyntheticImages()
    model = ConvNet(TRAINER_HP, problem.spec(TRAINER_HP))
    strategy = Strategy(prefetch=0, data_parallel=mode, bucket_mb=BUCKET_MB, sync_every=2)
    return Trainer(problem, model, TRAINER_HP, strategy=strategy, output_dir=out, max_steps=max_steps,
                   eval_every=0, loggers=[], dist=dist)


class TokenStream(Problem):
    """A streamed LM problem over fixed random tokens (the Trainer carries the LSTM state)."""

    def spec(self, hp: Any) -> ProblemSpec:
        return lstm_case_spec()

    def reader(self, split: str, hp: Any, *, seed: int = 0, shuffle: bool | None = None) -> Any:
        return stream_windows(lstm_tokens(), hp.batch_size, hp.max_length)


def lstm_trainer_run(out: Path, max_steps: int, mode: str = "none", dist: Any = None) -> Trainer:
    torch.manual_seed(0)
    hp = lstm_case().hp
    strategy = Strategy(prefetch=0, data_parallel=mode, bucket_mb=BUCKET_MB, sync_every=2)
    return Trainer(TokenStream(), LSTMLM(hp, lstm_case_spec()), hp, strategy=strategy, output_dir=out,
                   max_steps=max_steps, eval_every=0, loggers=[], dist=dist)


def assert_close_run(got: dict, ref: dict, what: str) -> None:
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-5, atol=1e-6, err_msg=what)
    np.testing.assert_allclose(got["grad_norms"], ref["grad_norms"], rtol=1e-5, atol=1e-6, err_msg=what)
    for key, value in ref["model"].items():
        torch.testing.assert_close(got["model"][key], value, rtol=1e-5, atol=1e-6, msg=f"{what}: {key}")
    assert got["reader"] == ref["reader"], what


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("dp")
    refs = {}
    torch.set_num_threads(1)
    for case in (conv_case(), lstm_case()):
        head = train(case, None, STEPS)
        start = {"model": head["model"], "optim": head["optim"], "reader": head["reader"]}
        torch.save(start, out / f"{case.name}_start.pt")
        refs[case.name] = {"head": head, "start": start, "tail": train(case, None, STEPS, init=start)}
    trainer_run(out / "single", 3).fit()
    os.link(CheckpointManager(out / "single" / "checkpoints").latest(), out / "single-3.ckpt")
    trainer_run(out / "single", 5).fit(resume=True)
    lstm_trainer_run(out / "lstm-single", 4).fit()
    mp.start_processes(worker, args=(str(out / "rendezvous"), str(out)), nprocs=WORLD, start_method="spawn")
    return {"refs": refs, "dist": torch.load(out / "results.pt", weights_only=True), "dir": out}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["allreduce", "reduce"])
@pytest.mark.parametrize("case", ["conv", "lstm"])
def test_two_ranks_match_one_process(runs: dict, case: str, mode: str) -> None:
    ref, got = runs["refs"][case], runs["dist"][f"{case}/{mode}"]
    assert_close_run(got["first"], ref["head"], f"{case}/{mode}")
    assert max(ref["head"]["grad_norms"]) > (conv_case() if case == "conv" else lstm_case()).hp.max_grad_norm


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["allreduce", "reduce"])
@pytest.mark.parametrize("case", ["conv", "lstm"])
def test_resume_across_world_sizes(runs: dict, case: str, mode: str) -> None:
    ref, got = runs["refs"][case], runs["dist"][f"{case}/{mode}"]
    # one-process checkpoint resumed on two ranks
    assert_close_run(got["resumed"], ref["tail"], f"{case}/{mode} 1->2")
    # two-rank checkpoint (Reduce shards gathered) resumed in one process
    built = {"conv": conv_case, "lstm": lstm_case}[case]()
    first = got["first"]
    tail = train(built, None, STEPS, init={"model": first["model"], "optim": first["optim"],
                                           "reader": first["reader"]})
    assert_close_run(tail, ref["tail"], f"{case}/{mode} 2->1")


@pytest.mark.timeout(120)
def test_reduce_mode_shards_optimizer_state(runs: dict) -> None:
    per_rank = runs["dist"]["state_bytes_per_rank"]["conv/state_bytes"]
    model = conv_case().make_model()
    full = sum(2 * p.numel() * 4 + 4 for p in model.parameters())  # Adam: exp_avg, exp_avg_sq, step
    assert sum(int(b) for b in per_rank) == full
    assert max(int(b) for b in per_rank) < 0.75 * full


def final_checkpoint(out: Path) -> dict:
    path = CheckpointManager(out / "checkpoints").latest()
    assert path is not None, f"no checkpoint in {out}"
    return load_checkpoint(path)


def assert_same_model(got: dict, ref: dict) -> None:
    assert got["meta"]["step"] == ref["meta"]["step"]
    for key, value in ref["model"].items():
        torch.testing.assert_close(got["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["allreduce", "reduce"])
def test_trainer_two_ranks_match_one_process(runs: dict, mode: str) -> None:
    got, ref = final_checkpoint(runs["dir"] / mode), load_checkpoint(runs["dir"] / "single-3.ckpt")
    assert_same_model(got, ref)
    assert got["meta"]["epoch"] == ref["meta"]["epoch"] == 1
    pairs = zip(sorted(got["optimizer"]["state"].items()), sorted(ref["optimizer"]["state"].items()))
    for (_, a), (_, b) in pairs:   # the Reduce shards were gathered into the full Adam state
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-4, atol=1e-9)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["allreduce", "reduce"])
def test_trainer_resumes_across_world_sizes(runs: dict, mode: str, tmp_path: Path) -> None:
    root = runs["dir"]
    ref = final_checkpoint(root / "single")                         # 1 process: 3 steps, resume, 5
    assert_same_model(final_checkpoint(root / f"{mode}-from-1"), ref)  # 1 process -> 2 ranks
    trainer = trainer_run(tmp_path, 5)                              # 2 ranks -> 1 process
    trainer.fit(resume=CheckpointManager(root / mode / "checkpoints").latest())
    assert_same_model(final_checkpoint(tmp_path), ref)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["allreduce", "reduce"])
def test_trainer_streamed_lm_two_ranks_match_one_process(runs: dict, mode: str) -> None:
    """Each rank carries the LSTM state of its own B/N contiguous streams across steps."""
    got = final_checkpoint(runs["dir"] / f"lstm-{mode}")
    ref = final_checkpoint(runs["dir"] / "lstm-single")
    assert_same_model(got, ref)
    got_state, ref_state = got["train_state"]["carried"], ref["train_state"]["carried"]
    assert got_state[0].shape[1] == ref_state[0].shape[1] // 2   # rank 0's rows of [L, B, H]
