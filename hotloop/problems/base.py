"""The Problem interface: a dataset with its generator, encoders and metrics.

Batches are ``dict[str, Tensor]``:

- ``inputs``:  int64 ``[B, S]`` source tokens (seq2seq / classification / LM)
- ``targets``: int64 ``[B, T]`` target tokens; ``PAD_ID`` positions are ignored
- LM problems with ``spec.streamed`` yield contiguous ``[B, T]`` windows so a
  model may carry its recurrent state from one batch to the next.

A reader is any iterable of batches for one epoch that also has
``state_dict()`` / ``load_state_dict()`` (position in the epoch + RNG) and
``set_epoch(epoch)``; see :class:`hotloop.data.Reader`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Protocol

import torch

from ..hparams import HParams
from ..registry import registered_name

__all__ = ["PAD_ID", "EOS_ID", "NUM_RESERVED", "Batch", "ProblemSpec", "Problem", "BatchReader",
           "open_reader"]

PAD_ID = 0
EOS_ID = 1
NUM_RESERVED = 2  # ids 0 (pad) and 1 (eos) are reserved by every built-in encoder

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ProblemSpec:
    """What a model needs to know about a problem (no data access)."""

    task: str                      # "seq2seq" | "lm" | "classify" | ... ("custom": a model of your own)
    input_vocab_size: int = 0      # 0: the inputs are not token ids (images, features) or need no size
    target_vocab_size: int = 0     # 0: the targets are not token ids (regression) or need no size
    max_input_length: int = 0
    max_target_length: int = 0
    streamed: bool = False         # LM batches are contiguous streams (carry state)
    pad_id: int = PAD_ID           # ignored target id; -1 when batches are never padded


class BatchReader(Protocol):
    def __iter__(self) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...


class Problem:
    """Base class; subclasses register with ``@problems.register("name")``.

    ``data_dir`` holds prepared (datagen) files; ``raw_dir`` holds raw
    downloads. Problems that generate data on the fly ignore both.
    """

    task: ClassVar[str] = "seq2seq"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    default_hparams: ClassVar[str] = ""
    #: the hparams set sized for this problem for each model that serves it (``--model`` name ->
    #: set); a model not listed gets ``default_hparams`` (:meth:`hparams_for`)
    model_hparams: ClassVar[Mapping[str, str]] = {}
    #: the splits the Trainer evaluates by default (the first one picks the best checkpoint)
    eval_splits: ClassVar[tuple[str, ...]] = ("valid",)

    def __init__(self, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir else None
        self.raw_dir = Path(raw_dir) if raw_dir else None

    @classmethod
    def hparams_for(cls, model: str) -> str:
        """The default hparams set of this problem with ``model`` ("" when there is none)."""
        return cls.model_hparams.get(model, cls.default_hparams)

    @property
    def name(self) -> str:
        """The name this problem's class was registered under (its class name if unregistered)."""
        return registered_name(type(self)) or type(self).__name__

    def spec(self, hp: HParams) -> ProblemSpec:
        raise NotImplementedError

    def prepare(self) -> None:
        """Datagen: make the data ready under ``data_dir`` (idempotent). Default: nothing."""

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> BatchReader:
        """A resumable reader over ``split`` ("train", "valid" or "test").

        ``workers`` (``Strategy.num_workers``) is how many processes may make batches
        ahead; readers with per-batch work use them, the same batches either way.
        """
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        """Turn target ids back into text (for ``hotloop decode``)."""
        return " ".join(str(i) for i in ids if i != PAD_ID)


def open_reader(problem: Problem, split: str, hp: HParams, *, workers: int = 0, **kwargs: Any) -> BatchReader:
    """``problem.reader(split, hp, **kwargs)``, with ``workers=`` passed when it is > 0.

    A problem whose ``reader`` does not take ``workers`` still serves runs without
    workers; asking it for workers is a clear error instead of a ``TypeError``.
    """
    if not workers:
        return problem.reader(split, hp, **kwargs)
    import inspect
    params = inspect.signature(problem.reader).parameters
    if "workers" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        from ..errors import UserError
        raise UserError(f"strategy num_workers={workers}: problem {problem.name!r}'s reader() takes no "
                        f"workers= argument; set num_workers=0 or add it to the reader")
    return problem.reader(split, hp, workers=workers, **kwargs)
