"""Run tuning/profiling without side effects on the caller's run.

``preserved_process_state()`` saves and restores every global random stream
(Python, NumPy, torch CPU and CUDA), torch's intra- and inter-op thread counts
and the backend flags (:func:`backend_flags`: oneDNN, cuDNN enabled/benchmark/
deterministic, float32 matmul precision, TF32 on CUDA); ``applied_strategy(strategy, device)``
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

__all__ = ["preserved_process_state", "applied_strategy", "snapshot_rng", "restore_rng", "backend_flags"]


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


def _matmul_precision() -> str | None:
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:          # legacy and per-backend precision APIs mixed: torch will not say
        return None


def backend_flags() -> dict:
    """The process-wide torch settings a Strategy (``apply_device_flags``) or a trial may change."""
    flags = {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
             "onednn": torch.backends.mkldnn.enabled,
             "cudnn_enabled": torch.backends.cudnn.enabled,
             "cudnn_benchmark": torch.backends.cudnn.benchmark,
             "cudnn_deterministic": torch.backends.cudnn.deterministic,
             "matmul_precision": _matmul_precision()}
    if torch.cuda.is_available():
        flags["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        flags["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    return flags


def _set_flags(flags: dict) -> None:
    """Put back ``flags`` (from :func:`backend_flags`), touching only what differs now."""
    now = backend_flags()
    if now["threads"] != flags["threads"]:
        torch.set_num_threads(flags["threads"])
    if now["interop_threads"] != flags["interop_threads"]:
        try:
            torch.set_num_interop_threads(flags["interop_threads"])
        except RuntimeError:      # the inter-op pool can be sized only before its first use
            pass
    for key, module, attr in (("onednn", torch.backends.mkldnn, "enabled"),
                              ("cudnn_enabled", torch.backends.cudnn, "enabled"),
                              ("cudnn_benchmark", torch.backends.cudnn, "benchmark"),
                              ("cudnn_deterministic", torch.backends.cudnn, "deterministic")):
        if now[key] != flags[key]:
            setattr(module, attr, flags[key])
    if flags["matmul_precision"] is not None and now["matmul_precision"] != flags["matmul_precision"]:
        torch.set_float32_matmul_precision(flags["matmul_precision"])
    if "tf32_matmul" in flags:
        if torch.backends.cuda.matmul.allow_tf32 != flags["tf32_matmul"]:
            torch.backends.cuda.matmul.allow_tf32 = flags["tf32_matmul"]
        if torch.backends.cudnn.allow_tf32 != flags["tf32_cudnn"]:
            torch.backends.cudnn.allow_tf32 = flags["tf32_cudnn"]


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Restore RNG streams, thread count and backend flags on exit."""
    rng, flags = snapshot_rng(), backend_flags()
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
    saved = backend_flags()
    apply_device_flags(strategy, device)
    try:
        yield
    finally:
        _set_flags(saved)
