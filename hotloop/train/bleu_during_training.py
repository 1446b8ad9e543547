"""Opt-in BLEU at each evaluation: decode the first sentences of the evaluated split and add
``bleu`` to that evaluation's metrics row (``metrics.jsonl``, the console and the loggers).

``hotloop train --eval-bleu N`` adds :class:`BleuAtEval` with ``batches=N``: the first
``N * batch_size`` sentences of the first evaluation split, in file order (the same
sentences every time), decoded greedily by default. In a multi-problem run every
``valid/<problem>`` split of a text translation problem is scored, with that task's
decoder. The score is sacreBLEU's (detokenized, case-sensitive, 13a), the same as
``hotloop eval --metrics bleu`` (which also raises the error for a problem without text);
only the main rank decodes. Decoding time is not training time: it is reported as ``bleu_seconds``.
"""
from __future__ import annotations

import time
from typing import Any

from ..decode.bleu import bleu_on_split, is_text_translation
from ..errors import UserError
from .events import Callback, Event

__all__ = ["BleuAtEval", "supports_bleu"]


def supports_bleu(problem: Any) -> bool:
    """Whether ``problem`` (an instance or its class) is a text translation problem (raw split text
    and a subword encoder), or a multi-problem run with at least one."""
    if hasattr(problem, "subproblem"):
        from ..registry import problems
        names = getattr(problem, "names", None) or getattr(problem, "problem_names", ())
        return any(is_text_translation(problems.get(n)) for n in names)
    return is_text_translation(problem)


def _translation_split(trainer: Any, split: str) -> bool:
    """Whether evaluation ``split`` is scored: the first split of a one-problem run; for a
    multi-problem run each ``valid/<problem>`` whose problem is a text translation problem."""
    problem = trainer.problem
    if hasattr(problem, "subproblem"):
        _, _, task = split.partition("/")
        return bool(task) and is_text_translation(problem.subproblem(task))
    return split == trainer.eval_splits[0]


class BleuAtEval(Callback):
    """Adds ``bleu`` and ``bleu_seconds`` to the metrics of each evaluation of ``split``.

    ``split=None`` scores the first evaluation split (a multi-problem run: each translation
    task's ``valid/<problem>``). ``batches`` x ``batch_size``
    sentences are decoded with ``beam_size`` (1 = greedy) and ``alpha``.
    """

    state_key = "bleu_at_eval"
    #: the metrics it adds to an evaluation (``--monitor bleu`` is known at start)
    adds_metrics = ("bleu", "bleu_sentences", "bleu_seconds")

    def __init__(self, batches: int, *, split: str | None = None, beam_size: int = 1, alpha: float = 0.6,
                 batch_size: int = 64) -> None:
        if batches < 1:
            raise UserError(f"BLEU during training needs at least 1 batch of sentences, got {batches}")
        if beam_size < 1:
            raise UserError(f"beam size must be >= 1, got {beam_size}")
        self.batches, self.split, self.beam_size = batches, split, beam_size
        self.alpha, self.batch_size = alpha, batch_size

    def on_event(self, event: Event, trainer: Any, **info: Any) -> None:
        if event is not Event.EVAL_END or not trainer.dist.is_main:
            return
        split = info["split"]
        if not (split == self.split if self.split is not None else _translation_split(trainer, split)):
            return
        model = getattr(trainer.model, "module", trainer.model)     # the model inside a DDP wrapper
        start = time.perf_counter()
        result = bleu_on_split(model, trainer.problem, trainer.hp, split, beam_size=self.beam_size,
                               alpha=self.alpha, max_batches=self.batches, batch_size=self.batch_size,
                               device=trainer.device)
        info["metrics"]["bleu"] = result.score
        info["metrics"]["bleu_sentences"] = result.sentences
        info["metrics"]["bleu_seconds"] = time.perf_counter() - start
