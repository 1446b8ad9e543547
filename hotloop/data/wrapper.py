"""`ReaderWrapper`: the one place that forwards the reader protocol to a wrapped reader.

Feeders (sync, speed-test) and the data-parallel row sharder wrap a reader and
change only how batches are produced; position, epoch and shutdown belong to
the wrapped reader.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ReaderWrapper"]


class ReaderWrapper:
    """Forwards ``state_dict`` / ``load_state_dict`` / ``set_epoch`` / ``close`` to ``self.reader``."""

    reader: Any

    def state_dict(self) -> dict[str, Any]:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.reader.set_epoch(epoch)

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "ReaderWrapper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
