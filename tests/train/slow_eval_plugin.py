"""``--import`` plugin for the stop-during-evaluation test: a model whose evaluation is slow.

``slow_eval_tagger``: the tests' ``TinyTagger`` whose ``loss`` sleeps ``SLOW_EVAL_SECONDS``
(default 0.05) per batch in eval mode, after touching the file ``$SLOW_EVAL_MARK`` (the test
sends its signal once it exists).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: the shared helpers

from helpers import TinyTagger  # noqa: E402
from hotloop.registry import models  # noqa: E402


@models.register("slow_eval_tagger")
class SlowEvalTagger(TinyTagger):
    def loss(self, batch, state=None, *, with_accuracy=False):
        if not self.training:
            mark = os.environ.get("SLOW_EVAL_MARK")
            if mark:
                Path(mark).touch()
            time.sleep(float(os.environ.get("SLOW_EVAL_SECONDS", "0.05")))
        return super().loss(batch, state, with_accuracy=with_accuracy)
