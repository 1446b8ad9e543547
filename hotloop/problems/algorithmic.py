"""T2T-style algorithmic problems generated on the fly from a seed (no download).

Each example is a random symbol sequence; the target is a function of it
(copy, reverse, sort, or the digits of a sum) followed by EOS. Batch ``i`` of
epoch ``e`` depends only on ``(seed, split, e, i)``, so readers resume exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Mapping

import numpy as np
import torch

from ..errors import UserError
from ..hparams import HParams
from ..registry import hparams_sets, problems
from .base import EOS_ID, NUM_RESERVED, PAD_ID, Batch, Problem, ProblemSpec

__all__ = ["AlgorithmicProblem", "AlgorithmicHParams", "IndexedReader", "generated_reader", "SPLIT_SEEDS",
           "UnknownSplitError"]


@dataclass(frozen=True)
class AlgorithmicHParams(HParams):
    """Problem knobs (symbols, lengths, sizes) live with the hparams so overrides reach them."""

    num_symbols: int = 10
    min_length: int = 1
    train_length: int = 12          # max input length in training
    eval_length: int = 12           # max input length in eval (raise it to test generalisation)
    train_examples: int = 51200     # examples per training "epoch"
    eval_examples: int = 1024


class _BatchAt:
    """``(seed, epoch, index) -> make_batch(rng)``: a picklable task for data workers."""

    def __init__(self, make_batch: Any) -> None:
        self.make_batch = make_batch

    def __call__(self, key: tuple[int, int, int]) -> Batch:
        return self.make_batch(np.random.default_rng(list(key)))


class IndexedReader:
    """Resumable reader over ``num_batches`` batches made by ``make_batch(rng)``.

    Batch ``i`` of epoch ``e`` uses ``np.random.default_rng([seed, e, i])``, so the
    batches are the same with any number of ``workers`` (processes that make batches
    ahead, in order; ``make_batch`` must then be picklable).
    """

    def __init__(self, make_batch: Any, num_batches: int, seed: int, *, workers: int = 0) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.make_batch = make_batch
        self.num_batches = num_batches
        self.seed = seed
        self.workers = workers
        self.epoch = 0
        self.index = 0
        self._pool: Any = None

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        make = _BatchAt(self.make_batch)
        keys = ((self.seed, self.epoch, i) for i in range(self.index, self.num_batches))
        if self.workers:
            from ..data.workers import WorkerPool
            if self._pool is None or self._pool.broken:
                self._pool = WorkerPool(make, self.workers)
            batches: Iterator[Batch] = self._pool.imap(keys)
        else:
            batches = map(make, keys)
        for batch in batches:
            self.index += 1
            yield batch
        self.index = 0
        self.epoch += 1

    def close(self) -> None:
        """Stop the worker processes (if any)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.index = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class UnknownSplitError(UserError, ValueError):
    """A split name the problem does not have."""


#: each split's stream of a generated problem (batch i of epoch e of split s: seed [3 * seed + s, e, i])
SPLIT_SEEDS = {"train": 0, "valid": 1, "test": 2}


def generated_reader(make_batch: Any, split: str, hp: HParams, *, train_examples: int, eval_examples: int,
                     seed: int, workers: int = 0, problem: str = "") -> IndexedReader:
    """The reader of a generated problem's ``split``: ``examples // batch_size`` batches of
    ``make_batch(rng)``, each split from its own seeded stream (``seed`` = hparams seed + reader seed)."""
    if split not in SPLIT_SEEDS:
        raise UnknownSplitError(f"{problem or 'problem'}: unknown split {split!r}; use train, valid or test")
    examples = train_examples if split == "train" else eval_examples
    return IndexedReader(make_batch, max(1, examples // hp.batch_size), seed=seed * 3 + SPLIT_SEEDS[split],
                         workers=workers)


class _SequenceBatches:
    """``rng -> batch`` of one algorithmic problem (picklable, for data workers)."""

    def __init__(self, problem: "AlgorithmicProblem", a: AlgorithmicHParams, batch_size: int, max_len: int) -> None:
        self.problem, self.a, self.batch_size, self.max_len = problem, a, batch_size, max_len

    def __call__(self, rng: np.random.Generator) -> Batch:
        a, problem, b = self.a, self.problem, self.batch_size
        in_len, out_len = problem.input_length(self.max_len), problem.output_length(self.max_len) + 1
        inputs = np.full((b, in_len), PAD_ID, dtype=np.int64)      # [B, S]
        targets = np.full((b, out_len), PAD_ID, dtype=np.int64)    # [B, T]
        lengths = rng.integers(a.min_length, self.max_len + 1, size=b)
        for row, n in enumerate(lengths):
            x, y = problem.sample(rng, int(n), a)
            inputs[row, :len(x)] = x + NUM_RESERVED
            targets[row, :len(y)] = y + NUM_RESERVED
            targets[row, len(y)] = EOS_ID
        return {"inputs": torch.from_numpy(inputs), "targets": torch.from_numpy(targets)}


class AlgorithmicProblem(Problem):
    """Base for sequence-to-sequence algorithmic tasks."""

    task: ClassVar[str] = "seq2seq"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy", "seq_accuracy")
    default_hparams: ClassVar[str] = "transformer_algorithmic"
    model_hparams: ClassVar[Mapping[str, str]] = {"transformer": "transformer_algorithmic",
                                                  "lstm_seq2seq": "lstm_seq2seq_algorithmic",
                                                  "mlp": "mlp_algorithmic"}
    target_extra: ClassVar[int] = 0   # target positions beyond the input length (addition carry)

    def _hp(self, hp: HParams) -> AlgorithmicHParams:
        return hp if isinstance(hp, AlgorithmicHParams) else AlgorithmicHParams()

    def spec(self, hp: HParams) -> ProblemSpec:
        a = self._hp(hp)
        vocab = NUM_RESERVED + a.num_symbols
        length = max(a.train_length, a.eval_length)
        return ProblemSpec(task=self.task, input_vocab_size=vocab, target_vocab_size=vocab,
                           max_input_length=self.input_length(length),
                           max_target_length=self.output_length(length) + 1)

    def input_length(self, n: int) -> int:
        return n

    def output_length(self, n: int) -> int:
        return n + self.target_extra

    def sample(self, rng: np.random.Generator, n: int, a: AlgorithmicHParams) -> tuple[np.ndarray, np.ndarray]:
        """Return (input symbols, target symbols) as ints in ``[0, num_symbols)``."""
        raise NotImplementedError

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> IndexedReader:
        a = self._hp(hp)
        max_len = a.train_length if split == "train" else a.eval_length
        return generated_reader(_SequenceBatches(self, a, hp.batch_size, max_len), split, hp,
                                train_examples=a.train_examples, eval_examples=a.eval_examples,
                                seed=a.seed + seed, workers=workers, problem=self.name)

    def decode(self, ids: Any) -> str:
        return " ".join(str(int(i) - NUM_RESERVED) for i in ids if int(i) >= NUM_RESERVED)


@problems.register("algorithmic_copy")
class Copy(AlgorithmicProblem):
    def sample(self, rng, n, a):
        x = rng.integers(0, a.num_symbols, size=n)
        return x, x


@problems.register("algorithmic_reverse")
class Reverse(AlgorithmicProblem):
    def sample(self, rng, n, a):
        x = rng.integers(0, a.num_symbols, size=n)
        return x, x[::-1]


@problems.register("algorithmic_sort")
class Sort(AlgorithmicProblem):
    def sample(self, rng, n, a):
        x = rng.integers(0, a.num_symbols, size=n)
        return x, np.sort(x)


@problems.register("algorithmic_addition")
class Addition(AlgorithmicProblem):
    """Two base-``num_symbols`` numbers of up to n digits each, least significant digit first.

    Input: ``a_digits <sep> b_digits`` (the separator is the last symbol, so the
    digit base is ``num_symbols - 1``); target: digits of the sum.
    """

    target_extra: ClassVar[int] = 1

    def input_length(self, n: int) -> int:
        return 2 * n + 1

    def sample(self, rng, n, a):
        base = a.num_symbols - 1
        x = rng.integers(0, base, size=n)
        y = rng.integers(0, base, size=n)
        total, carry, out = 0, 0, []
        for i in range(n):
            total = int(x[i]) + int(y[i]) + carry
            out.append(total % base)
            carry = total // base
        if carry:
            out.append(carry)
        return np.concatenate([x, [base], y]), np.array(out)


@hparams_sets.register("algorithmic_base")
def algorithmic_base() -> AlgorithmicHParams:
    return AlgorithmicHParams()
