"""How close a candidate's losses and updates must stay to eager fp32's: the engine's tolerance,
widened where a setting re-splits float reductions."""
from __future__ import annotations

import torch

from ..engine.parity import default_tolerance
from ..engine.strategy import Strategy

__all__ = ["THREADS_TOL", "BITWISE_FOREACH", "parity_tolerance"]

THREADS_TOL = 1e-5     # a different intra-op thread count re-splits float reductions (1-ulp level)
#: optimizers whose multi-tensor (foreach) update is held bitwise to their per-tensor loop.
#: All four built-ins measure bitwise (tests/engine: tiny transformer and LSTM LM, 10 steps),
#: but Adam/AdamW divide by sqrt(v) and are kept at THREADS_TOL as a margin, as is every
#: optimizer a user registers
BITWISE_FOREACH = ("sgd", "momentum")


def parity_tolerance(strategy: Strategy, baseline: Strategy, device: torch.device,
                     optimizer: str = "sgd") -> float:
    """The engine's tolerance for ``strategy``; at least THREADS_TOL when it changes the thread
    count, or the optimizer's update path for an optimizer outside BITWISE_FOREACH."""
    tol = default_tolerance(strategy, device)
    if strategy.intra_op_threads != baseline.intra_op_threads:
        tol = max(tol, THREADS_TOL)
    if strategy.fused_optimizer != baseline.fused_optimizer and optimizer not in BITWISE_FOREACH:
        tol = max(tol, THREADS_TOL)
    return tol
