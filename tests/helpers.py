"""Helpers shared by test modules: import them with ``from helpers import ...``.

``tests/`` is on ``sys.path`` while pytest runs (the rootdir ``conftest.py`` lives
there), so every test directory imports this one module. Fixtures stay in the
``conftest.py`` files; plain functions and classes live here.

- trainer runs: :func:`tiny_hp`, :func:`make_trainer`, :func:`params_of`
- data: :class:`ListReader` (a resumable reader over fixed batches),
  :class:`TinyStreamLM` (a streamed LM problem) and :func:`tiny_lm_hp`
- models: :class:`TinyTagger` (an unregistered user model)
- real data: :func:`raw_data_dir`, :func:`require_raw_data` (skip locally, fail under ``CI=true``)
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hotloop  # noqa: F401 - declares the built-ins
from hotloop.data import stream_windows
from hotloop.engine import Strategy
from hotloop.hparams import get_hparams
from hotloop.models.base import SequenceModel
from hotloop.problems.base import Problem, ProblemSpec
from hotloop.registry import models, problems
from hotloop.train import Callback, Event, Trainer
from hotloop.compose.build import build_model
from hotloop.train.loggers import default_loggers

__all__ = ["TINY", "tiny_hp", "make_trainer", "params_of", "ListReader", "TinyStreamLM", "tiny_lm_hp",
           "TinyTagger", "REPO", "in_ci", "raw_data_dir", "require_raw_data"]

REPO = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    """True when the environment says this is a CI run (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def raw_data_dir(folder: str) -> Path:
    """``$HOTLOOP_RAW_ROOT/<folder>``, else ``<repo>/../shared/data/<folder>`` (the shared raw-data root)."""
    root = os.environ.get("HOTLOOP_RAW_ROOT")
    return (Path(root) if root else REPO.parent / "shared" / "data") / folder


def require_raw_data(marker: Path, what: str) -> Path:
    """Return ``marker``'s folder when ``marker`` exists; otherwise skip the test, or fail it under CI.

    A CI run must not pass by skipping every real-data test: there, missing data is an error.
    """
    if marker.is_file():
        return marker.parent
    message = f"{what} raw data not found: {marker} is missing (set HOTLOOP_RAW_ROOT to your raw-data root)"
    if in_ci():
        pytest.fail(message + "; CI=true needs it", pytrace=False)
    pytest.skip(message)

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2,max_steps=10")


def tiny_hp(extra: str = ""):
    """A tiny ``transformer_algorithmic`` run (10 steps), plus ``extra`` overrides."""
    return get_hparams("transformer_algorithmic", TINY + ("," + extra if extra else ""))


_DEFAULT = Strategy(prefetch=0)


def make_trainer(out: Path | None, hp=None, *, strategy: Any = _DEFAULT, problem: Any = None,
                 model_name: str = "transformer", **kwargs: Any) -> Trainer:
    """A Trainer on ``algorithmic_reverse`` (default) writing to ``out``, without console logging."""
    hp = hp if hp is not None else tiny_hp()
    problem = problem if problem is not None else problems.get("algorithmic_reverse")()
    model = build_model(models.get(model_name), hp, problem.spec(hp))
    kwargs.setdefault("loggers", default_loggers(out, console=False))
    return Trainer(problem, model, hp, strategy=strategy, output_dir=out, **kwargs)


def params_of(trainer: Trainer) -> dict[str, torch.Tensor]:
    """A detached copy of the trainer's model state."""
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


class ListReader:
    """A resumable reader over a fixed list of batches (same batches every epoch)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches, self.epoch, self.index = batches, 0, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        while self.index < len(self.batches):
            self.index += 1
            yield self.batches[self.index - 1]
        self.index, self.epoch = 0, self.epoch + 1

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.index = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


class TinyStreamLM(Problem):
    """A streamed LM over a fixed random token stream: [B, T] windows, contiguous per row."""

    task = "lm"
    vocab = 12

    def spec(self, hp) -> ProblemSpec:
        return ProblemSpec(task="lm", input_vocab_size=self.vocab, target_vocab_size=self.vocab,
                           streamed=True, pad_id=-1)

    def reader(self, split, hp, *, seed=0, shuffle=None, workers=0):
        rng = np.random.default_rng({"train": 0, "valid": 1, "test": 2}[split])
        return stream_windows(rng.integers(0, self.vocab, size=hp.batch_size * 41), hp.batch_size, hp.max_length)


def tiny_lm_hp(extra: str = ""):
    """A tiny ``lstm_lm_small`` run (2x16, 12 steps) for :class:`TinyStreamLM`, plus ``extra`` overrides."""
    base = ("hidden_size=16,num_layers=2,batch_size=4,max_length=5,max_epochs=0,max_steps=12,"
            "dropout=0.2,learning_rate=0.5,lr_schedule=constant")
    return get_hparams("lstm_lm_small", base + ("," + extra if extra else ""))


class TinyTagger(SequenceModel):
    """A user model that is *not* registered: embedding -> linear -> tanh -> output, per position."""

    tasks = ("seq2seq",)

    def __init__(self, hp, spec) -> None:
        super().__init__(hp, spec)
        self.embed = nn.Embedding(spec.input_vocab_size, hp.hidden_size)
        self.mix = nn.Linear(hp.hidden_size, hp.hidden_size)
        self.out = nn.Linear(hp.hidden_size, spec.target_vocab_size)

    def forward(self, batch, state=None):
        x = self.embed(batch["inputs"])                       # [B, S, H]
        steps = batch["targets"].shape[1]
        x = nn.functional.pad(x, (0, 0, 0, max(0, steps - x.shape[1])))[:, :steps]  # [B, T, H]
        return self.out(torch.tanh(self.mix(x))), None        # [B, T, V]


def run_in_fresh_process(fn: Any, *args: Any, timeout: float = 120) -> None:
    """Run ``fn(*args)`` (a module-level function) in a spawned process; fail unless it exits 0.

    For tests that signal their own process: the suite's long-lived process has native thread
    pools a signal should not meet.
    """
    import multiprocessing
    child = multiprocessing.get_context("spawn").Process(target=fn, args=args)
    child.start()
    child.join(timeout)
    assert child.exitcode == 0, f"{fn.__name__} failed in its own process (exit code {child.exitcode})"


class StopAt(Callback):
    """Stops a run after ``step`` (the schedule still plans for the full run)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_event(self, event: Event, trainer: Trainer, **info: Any) -> None:
        if event is Event.STEP_END and trainer.step == self.step:
            trainer.request_stop("test stop")


def repeating_stream_losses(step: Any, rows: int, window: int, steps: int = 80, state: Any = None) -> list[float]:
    """Mean token NLL of each of ``steps`` calls of a built LM ``step`` on a stream repeating
    0..9 (``rows`` rows), read in windows of ``window`` tokens (state carried)."""
    pattern = torch.arange(0, 10).repeat(rows, 20)                     # [rows, 200] deterministic
    losses = []
    for i in range(steps):
        chunk = pattern[:, (i % 5) * window:(i % 5) * window + window + 1]
        result = step([{"inputs": chunk[:, :-1], "targets": chunk[:, 1:]}], state)
        state = result.state
        losses.append(float(result.stats["nll_sum"]) / float(result.stats["tokens"]))
    return losses


def briefly_trained(model: nn.Module, batches: list[dict[str, torch.Tensor]], steps: int = 60,
                    lr: float = 1e-2) -> nn.Module:
    """``model`` after ``steps`` Adam steps over ``batches``, in eval mode.

    Runtime-vs-torch decoding tests use it: random weights make greedy choices near ties,
    where an exported graph's last-ulp differences (oneDNN and OpenVINO pick kernels by
    ISA) flip the argmax; a trained model's top choices are decisive.
    """
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for i in range(steps):
        loss = model.loss(batches[i % len(batches)]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval()


class FakeClock:
    """A clock for simulated trial steps: ``now`` moves only when a test adds seconds to it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
