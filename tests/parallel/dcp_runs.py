"""The training runs behind tests/parallel/test_dcp_checkpoint.py (gloo, CPU processes).

A conv classifier on 48 fixed images (6 batches of 8 per epoch, shuffled per epoch); the model
records the ids of the rows it trains on, per step, so a test can check which global batches
each run saw. ``worker`` runs one job of ``world`` ranks: the 4-rank job writes a step-5
checkpoint; the 2-rank job trains 9 steps straight (checkpoints at 3, 6, 9), the same with
asynchronous saves, 5 steps then a resume to 9, a resume from the 4-rank checkpoint, Reduce
mode, FSDP (5 steps; and a resume of the DDP step-5 checkpoint under FSDP to 9), a
registered problem/model for ``eval`` / ``export``, and 2 steps of a streamed LSTM LM.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hotloop.data import from_arrays, stream_windows
from hotloop.engine.strategy import Strategy
from hotloop.models.conv import ConvNet, ConvNetHParams
from hotloop.models.lstm_lm import LSTMLM, LSTMLMHParams
from hotloop.problems.base import Problem, ProblemSpec
from hotloop.train.trainer import Trainer

DIR = "checkpoints/step-{:08d}.dcp"
HP = ConvNetHParams(image_size=8, image_channels=2, num_classes=5, conv_channels=(4, 8), batch_size=8,
                    optimizer="adam", learning_rate=1e-2, max_grad_norm=0.05)
EXAMPLES = 48
STEPS_PER_EPOCH = EXAMPLES // HP.batch_size


class IdImages(Problem):
    """48 fixed random images whose batches carry each row's id."""

    task = "classify"

    def spec(self, hp: Any) -> ProblemSpec:
        return ProblemSpec(task="classify", input_vocab_size=0, target_vocab_size=5, max_target_length=1,
                           pad_id=-1)

    def reader(self, split: str, hp: Any, *, seed: int = 0, shuffle: bool | None = None) -> Any:
        rng = np.random.default_rng(7)
        columns = {"inputs": rng.standard_normal((EXAMPLES, 2, 8, 8)).astype(np.float32),
                   "targets": rng.integers(0, 5, size=(EXAMPLES, 1)), "ids": np.arange(EXAMPLES)}
        return from_arrays(columns).shuffle(EXAMPLES, seed=11).batch(hp.batch_size, drop_last=True)


class RecordingConvNet(ConvNet):
    """A conv net that records the ids of every training batch it sees (one list per step)."""

    def __init__(self, hp: Any, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        self.seen: list[list[int]] = []

    def loss(self, batch: Any, state: Any = None, *, with_accuracy: bool = False) -> Any:
        if self.training:
            self.seen.append([int(i) for i in batch["ids"]])
        return super().loss(batch, state, with_accuracy=with_accuracy)


def run(out: Path, max_steps: int, *, dist: Any = None, resume: Any = False, mode: str = "allreduce",
        async_checkpoint: bool = False, checkpoint_every: int = 3) -> Trainer:
    """Train to ``max_steps``; the ids this rank saw go to ``out/ids-<rank>-<first step>.json``."""
    torch.manual_seed(0)
    problem = IdImages()
    model = RecordingConvNet(HP, problem.spec(HP))
    strategy = Strategy(prefetch=0, data_parallel=mode if dist is not None else "none", bucket_mb=0.002)
    trainer = Trainer(problem, model, HP, strategy=strategy, output_dir=out, max_steps=max_steps,
                      eval_every=0, eval_splits=(), checkpoint_every=checkpoint_every, keep_last=5,
                      loggers=[], dist=dist, async_checkpoint=async_checkpoint)
    trainer.fit(resume=resume)
    rank = dist.rank if dist is not None else 0
    start = trainer.step - len(model.seen)
    (out / f"ids-{rank}-{start}.json").write_text(json.dumps(model.seen))
    return trainer


LSTM_HP = LSTMLMHParams(hidden_size=8, num_layers=2, batch_size=4, max_length=5, optimizer="sgd",
                        learning_rate=1.0, max_grad_norm=0.5, init_scale=0.1)


class TokenStream(Problem):
    """A streamed LM over fixed random tokens: each rank carries the LSTM state of its streams."""

    def spec(self, hp: Any) -> ProblemSpec:
        return ProblemSpec(task="lm", input_vocab_size=20, target_vocab_size=20, max_input_length=5,
                           max_target_length=5, streamed=True, pad_id=-1)

    def reader(self, split: str, hp: Any, *, seed: int = 0, shuffle: bool | None = None) -> Any:
        tokens = np.random.default_rng(3).integers(0, 20, size=4 * 80).astype(np.int32)
        return stream_windows(tokens, hp.batch_size, hp.max_length)


def lstm_run(out: Path, max_steps: int, *, dist: Any = None, resume: Any = False) -> Trainer:
    """The streamed LM to ``max_steps`` (a checkpoint every 2 steps)."""
    torch.manual_seed(0)
    problem = TokenStream()
    strategy = Strategy(prefetch=0, data_parallel="allreduce" if dist is not None else "none", bucket_mb=0.002)
    trainer = Trainer(problem, LSTMLM(LSTM_HP, problem.spec(LSTM_HP)), LSTM_HP, strategy=strategy,
                      output_dir=out, max_steps=max_steps, eval_every=0, eval_splits=(), checkpoint_every=2,
                      loggers=[], dist=dist)
    trainer.fit(resume=resume)
    return trainer


def registered_run(out: Path, dist: Any) -> None:
    """2 steps of the registered image_synthetic / conv_net, for ``hotloop eval`` and ``export``."""
    from hotloop.problems.synthetic_images import SyntheticImages
    hp = HP.replace(train_examples=32, eval_examples=16)
    torch.manual_seed(0)
    problem = SyntheticImages()
    model = ConvNet(hp, problem.spec(hp))
    Trainer(problem, model, hp, strategy=Strategy(prefetch=0), output_dir=out, max_steps=2, eval_every=0,
            eval_splits=(), loggers=[], dist=dist,
            run_info={"problem": "image_synthetic", "model": "conv_net", "hparams_set": "conv_net_base"}).fit()


def worker(rank: int, world: int, store_file: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from hotloop.parallel import ProcessGroupContext
    from hotloop.parallel.group import init_process_group
    init_process_group("gloo", timeout_s=60, store_file=store_file)
    out = Path(out_dir)
    ctx = lambda mode="allreduce": ProcessGroupContext(mode, 0.002)  # noqa: E731
    if world == 4:
        run(out / "w4", 5, dist=ctx())
    else:
        run(out / "straight", 9, dist=ctx())
        run(out / "async", 9, dist=ctx(), async_checkpoint=True)
        run(out / "stopped", 5, dist=ctx())
        run(out / "stopped", 9, dist=ctx(), resume=True)
        w4 = out / "w4" / "checkpoints" / "step-00000005.dcp"
        run(out / "from4", 9, dist=ctx(), resume=w4)
        run(out / "reduce", 5, dist=ctx("reduce"), mode="reduce")
        run(out / "fsdp", 5, dist=ctx("fsdp"), mode="fsdp")
        run(out / "fsdp-from2", 9, dist=ctx("fsdp"), mode="fsdp", resume=out / "stopped" / DIR.format(5))
        registered_run(out / "registered", ctx())
        lstm_run(out / "lstm2", 2, dist=ctx())
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # skip C++ static destructors (a gloo thread at teardown; see test_dp_equivalence.py)
