"""Run tuning/profiling without side effects on the caller's run.

``preserved_process_state()`` saves and restores every global random stream
(Python, NumPy, torch CPU and CUDA), torch's intra-op thread count and the
backend flags a Strategy may touch; ``applied_strategy(strategy, device)``
sets those flags (through the engine's ``apply_device_flags``) for one timed step.
"""
from __future__ import annotations

import contextlib
import random
from typing import Iterator

import numpy as np
import torch

from ..engine.flags import apply_device_flags
from ..engine.strategy import Strategy

__all__ = ["preserved_process_state", "applied_strategy", "snapshot_rng", "restore_rng"]


def snapshot_rng() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _flags() -> dict:
    flags = {"threads": torch.get_num_threads(), "onednn": torch.backends.mkldnn.enabled,
             "cudnn_benchmark": torch.backends.cudnn.benchmark,
             "matmul_precision": torch.get_float32_matmul_precision()}
    if torch.cuda.is_available():
        flags["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        flags["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    return flags


def _set_flags(flags: dict) -> None:
    if torch.get_num_threads() != flags["threads"]:
        torch.set_num_threads(flags["threads"])
    torch.backends.mkldnn.enabled = flags["onednn"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    if torch.get_float32_matmul_precision() != flags["matmul_precision"]:
        torch.set_float32_matmul_precision(flags["matmul_precision"])
    if "tf32_matmul" in flags:
        torch.backends.cuda.matmul.allow_tf32 = flags["tf32_matmul"]
        torch.backends.cudnn.allow_tf32 = flags["tf32_cudnn"]


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Restore RNG streams, thread count and backend flags on exit."""
    rng, flags = snapshot_rng(), _flags()
    try:
        yield
    finally:
        restore_rng(rng)
        _set_flags(flags)


@contextlib.contextmanager
def applied_strategy(strategy: Strategy, device: torch.device) -> Iterator[None]:
    """Set the process-wide knobs of ``strategy`` (engine's ``apply_device_flags``) for a block.

    The previous flags come back on exit, so interleaved trials of candidates
    with different thread counts or backend flags do not leak into each other.
    """
    saved = _flags()
    apply_device_flags(strategy, device)
    try:
        yield
    finally:
        _set_flags(saved)
