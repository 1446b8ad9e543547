"""A per-batch hook on the default problem's train reader, for ``--import`` modules of the launch tests.

``install(hook)`` wraps ``AlgorithmicProblem``'s train reader; ``hook(reader)`` runs before each
batch is handed out (it may sleep, write marks or raise). The reader's state passes through.
"""
from __future__ import annotations

from typing import Any, Callable

from hotloop.problems.algorithmic import AlgorithmicProblem

__all__ = ["install"]


class _Hooked:
    def __init__(self, reader: Any, hook: Callable[[Any], None]) -> None:
        self.reader, self.hook = reader, hook

    def __iter__(self):
        for batch in self.reader:
            self.hook(self.reader)
            yield batch

    def __len__(self) -> int:
        return len(self.reader)

    def state_dict(self) -> dict:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.reader.set_epoch(epoch)


def install(hook: Callable[[Any], None]) -> None:
    """Run ``hook(reader)`` before every train batch of the default problem (in this process)."""
    plain = AlgorithmicProblem.reader

    def hooked(self, split, hp, **kwargs):
        inner = plain(self, split, hp, **kwargs)
        return _Hooked(inner, hook) if split == "train" else inner

    AlgorithmicProblem.reader = hooked
