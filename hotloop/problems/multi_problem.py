"""Several registered problems trained as one: :class:`MultiProblem` (a Problem).

``MultiProblem([copy, reverse, images])`` (or ``multi_problem_class("a,b,c")``,
what ``--problem a,b,c`` builds) serves:

- ``reader("train")``: a :class:`~hotloop.problems.mixing.MixingReader`, each batch
  from one problem drawn by the hparams' mixing schedule (:class:`MixingHParams`:
  ``mixing``, ``mixing_rates``, ``mixing_temperature``, ``mixing_epoch_steps``);
- ``reader("valid/<name>")`` (and ``test/<name>``): that problem's reader, tagged;
  ``eval_splits`` lists ``valid/<name>`` per problem, so the Trainer writes one row per
  problem; ``reader("valid")`` chains every problem's valid data;
- ``spec(hp)``: a :class:`MultiProblemSpec` (task ``"multi"``) carrying every problem's
  own :class:`ProblemSpec` as a :class:`TaskSpec`.

Every batch carries ``task:<name>`` (see :mod:`hotloop.problems.mixing`). Every
sub-problem reads the same hparams, so the run's hparams class should hold the
fields each problem reads (``MultiModelHParams`` does). A streamed LM problem
(``ptb_lm``) is read as independent windows: models of a multi-problem run carry
no state from one batch to the next.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterable, Sequence

from ..errors import UserError
from ..hparams import HParams
from .base import PAD_ID, BatchReader, Problem, ProblemSpec, open_reader
from .mixing import (ChainReader, MixingReader, TaggedReader, mixing_probabilities, reader_size,
                     task_of)

__all__ = ["MixingHParams", "TaskSpec", "MultiProblemSpec", "MultiProblem", "multi_problem_class",
           "split_problem_names", "task_of", "SEED_STRIDE"]

SEED_STRIDE = 1009  # task i reads with seed + i * SEED_STRIDE (task 0 reads what it reads alone)


@dataclass(frozen=True)
class MixingHParams(HParams):
    """How a multi-problem run picks each step's problem."""

    mixing: str = "proportional"           # proportional | rates | temperature | uniform
    mixing_rates: tuple[float, ...] = ()   # mixing=rates: one weight per problem, e.g. 0.5:0.3:0.2
    mixing_temperature: float = 2.0        # mixing=temperature: p ~ size ** (1 / T)
    mixing_epoch_steps: int = 0            # batches per mixed epoch; 0 = the problems' batches summed


@dataclass(frozen=True)
class TaskSpec:
    """One problem of a multi-problem run, as the model sees it."""

    name: str
    index: int
    spec: ProblemSpec
    vocabulary: str       # problems with the same vocabulary key share token embeddings and softmax

    @property
    def is_image(self) -> bool:
        """Image inputs (a classification problem without an input vocabulary)."""
        return self.spec.task == "classify" and self.spec.input_vocab_size == 0


@dataclass(frozen=True)
class MultiProblemSpec(ProblemSpec):
    """A ``"multi"`` spec: sizes are the maxima over ``tasks``; ``tasks`` hold each problem's spec."""

    tasks: tuple[TaskSpec, ...] = ()


def vocabulary_key(problem: Problem, spec: ProblemSpec) -> str:
    """``problem.vocabulary`` when the problem names its vocabulary, else its module and sizes
    (problems of one module with the same sizes, such as the algorithmic family, share one)."""
    named = getattr(problem, "vocabulary", None)
    if isinstance(named, str) and named:
        return named
    return f"{type(problem).__module__}:{spec.input_vocab_size}:{spec.target_vocab_size}"


def split_problem_names(text: str) -> list[str]:
    """``"a,b,c"`` -> ``["a", "b", "c"]``; empty or repeated names are a :class:`UserError`."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UserError(f"--problem {text!r}: empty problem name in the list")
    if len(set(names)) != len(names):
        raise UserError(f"--problem {text!r}: a problem is listed twice")
    return names


class MultiProblem(Problem):
    """Several problems as one (see the module doc)."""

    task: ClassVar[str] = "multi"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    default_hparams: ClassVar[str] = "multimodel_base"

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__()
        if not problems:
            raise UserError("a multi-problem run needs at least one problem")
        self.problems = list(problems)
        names = [p.name for p in self.problems]
        if len(set(names)) != len(names):
            raise UserError(f"problems {names}: a problem is listed twice")
        self.names = names

    @property
    def name(self) -> str:
        return ",".join(self.names)

    @property
    def eval_splits(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"valid/{n}" for n in self.names)

    def subproblem(self, name: str) -> Problem:
        """The problem called ``name``."""
        if name not in self.names:
            raise UserError(f"no problem {name!r} in this run ({', '.join(self.names)})")
        return self.problems[self.names.index(name)]

    def prepare(self) -> None:
        for problem in self.problems:
            problem.prepare()

    def spec(self, hp: HParams) -> MultiProblemSpec:
        tasks = []
        for i, problem in enumerate(self.problems):
            sub = problem.spec(hp)
            tasks.append(TaskSpec(problem.name, i, sub, vocabulary_key(problem, sub)))
        pads = {t.spec.pad_id for t in tasks}
        return MultiProblemSpec(
            task="multi", input_vocab_size=max(t.spec.input_vocab_size for t in tasks),
            target_vocab_size=max(t.spec.target_vocab_size for t in tasks),
            max_input_length=max(t.spec.max_input_length for t in tasks),
            max_target_length=max(t.spec.max_target_length for t in tasks),
            streamed=False, pad_id=pads.pop() if len(pads) == 1 else PAD_ID, tasks=tuple(tasks))

    def _sub_reader(self, i: int, split: str, hp: HParams, seed: int, shuffle: bool | None,
                    workers: int) -> BatchReader:
        problem = self.problems[i]
        streamed = problem.spec(hp).streamed
        return open_reader(problem, split, hp, workers=workers, seed=seed + i * SEED_STRIDE,
                           shuffle=None if streamed else shuffle)

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> BatchReader:
        base, _, name = split.partition("/")
        if name:
            problem = self.subproblem(name)
            i = self.problems.index(problem)
            return TaggedReader(self._sub_reader(i, base, hp, seed, False if shuffle is None else shuffle,
                                                 workers), name, i)
        if split != "train":
            return ChainReader([self.reader(f"{split}/{n}", hp, seed=seed, shuffle=shuffle, workers=workers)
                                for n in self.names])
        readers = [self._sub_reader(i, "train", hp, seed, shuffle, workers) for i in range(len(self.names))]
        sizes = [reader_size(r) for r in readers]
        mixing = getattr(hp, "mixing", "proportional")
        probabilities = mixing_probabilities(mixing, sizes, getattr(hp, "mixing_rates", ()),
                                             getattr(hp, "mixing_temperature", 1.0))
        epoch_steps = getattr(hp, "mixing_epoch_steps", 0) or sum(sizes)
        return MixingReader(readers, self.names, probabilities, seed=hp.seed + seed, epoch_steps=epoch_steps)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids of the first problem as text (use ``subproblem(name).decode`` for the others)."""
        return self.problems[0].decode(ids)


def multi_problem_class(names: str | Sequence[str]) -> type[MultiProblem]:
    """A :class:`MultiProblem` subclass for registered ``names`` that is built like any problem
    class: ``cls(data_dir=None, raw_dir=None)``. ``data_dir`` is a root holding one folder per
    problem (``<data_dir>/<name>``); raw data comes from each problem's default raw folder
    (``HOTLOOP_RAW_ROOT``), so ``raw_dir`` is refused."""
    from ..registry import problems as registry
    listed = split_problem_names(names) if isinstance(names, str) else list(names)
    classes = [registry.get(n) for n in listed]   # unknown names fail here, with the registry's hint

    def __init__(self: MultiProblem, data_dir: str | Path | None = None,
                 raw_dir: str | Path | None = None) -> None:
        if raw_dir:
            raise UserError(f"--raw-dir {raw_dir}: a multi-problem run reads each problem's own raw "
                            f"folder; set --raw-root (HOTLOOP_RAW_ROOT) instead")
        root = Path(data_dir) if data_dir else None
        MultiProblem.__init__(self, [cls(data_dir=root / n if root else None) for cls, n in zip(classes, listed)])

    return type(f"MultiProblem[{','.join(listed)}]", (MultiProblem,),
                {"__init__": __init__, "problem_names": tuple(listed), "__module__": __name__})
