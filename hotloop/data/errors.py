"""Exceptions raised by the data layer (one clear message each)."""
from __future__ import annotations

from ..errors import UserError

__all__ = ["DataError", "ChecksumError", "ReaderError", "WorkerError"]


class DataError(UserError, RuntimeError):
    """Prepared or raw data is missing, corrupt, truncated or inconsistent.

    The message names the offending file and says how to fix it.
    """


class ChecksumError(DataError):
    """A file's checksum does not match the expected value."""


class ReaderError(RuntimeError):
    """An exception raised inside the input pipeline (generator, map function,
    producer thread). The message carries the original traceback text."""


class WorkerError(ReaderError):
    """A data worker process failed: its function raised, or it died (killed by the OS)."""
