"""How much time the autotuner may spend (read by the tuner and by ``hotloop tune``'s flags).

Kept free of torch imports so the CLI can build its parser cheaply.
"""
from __future__ import annotations

__all__ = ["DEFAULT_BUDGET_FRACTION", "DEFAULT_MAX_SECONDS"]

#: hard cap on tuning time, seconds
DEFAULT_MAX_SECONDS = 60.0
#: tuning's share of the planned run. The step running when the budget ends and the winner's parity
#: check come on top (measured: 5% budgets ended at 5.06-5.34% of short runs), so the budget aims
#: below the 5% that tuning must stay under.
DEFAULT_BUDGET_FRACTION = 0.045
