"""How much time the autotuner may spend (read by the tuner and by ``hotloop tune``'s flags).

Kept free of torch imports so the CLI can build its parser cheaply.
"""
from __future__ import annotations

__all__ = ["DEFAULT_BUDGET_FRACTION", "DEFAULT_MAX_SECONDS"]

#: hard cap on tuning time, seconds
DEFAULT_MAX_SECONDS = 60.0
#: tuning's share of the planned run. The step running when the budget ends and the winner's parity
#: check come on top (5% budgets ended at up to 5.34% of benchmarks/auto.py's short runs), so the
#: budget aims below the 5% that tuning must stay under; a run of a few seconds can still exceed it
#: (reading the trial batches and calibrating eager take a fixed time; docs/tune.md).
DEFAULT_BUDGET_FRACTION = 0.045
