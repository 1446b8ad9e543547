"""The non-finite policy under ``hotloop train --nproc 2`` (gloo, CPU): a NaN loss on rank 1 only.

A user module (``--import``) makes the default transformer's training loss NaN at step 3 on
rank 1 alone, and records, per rank, where the policy acted and the final parameters. With
``stop`` both ranks stop at the same step, and rank 0, whose own loss was finite, says it
happened on another rank; with ``skip`` both ranks discard that one update and end with the
same, finite parameters.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAN_STEP = 3

NAN_ON_RANK_1 = textwrap.dedent('''
    """Rank 1's training loss is NaN at step NAN_STEP; each rank records its policy's verdict and parameters."""
    import hashlib
    import json
    import os
    from pathlib import Path

    import torch

    from hotloop.models.transformer import Transformer
    from hotloop.train.nonfinite import NonFiniteGuard
    from hotloop.train.trainer import Trainer

    RANK, OUT, AT = os.environ["RANK"], Path(os.environ["NAN_DIR"]), int(os.environ["NAN_STEP"])
    _loss, _check, _fit = Transformer.loss, NonFiniteGuard.check, Trainer.fit
    calls = {"train": 0}

    def loss(self, batch, state, with_accuracy=False):
        out = _loss(self, batch, state, with_accuracy=with_accuracy)
        if self.training and torch.is_grad_enabled():
            calls["train"] += 1
            if calls["train"] == AT and RANK == "1":
                out.loss = out.loss * float("nan")
        return out

    def check(self, count, first_step, last_step):
        try:
            _check(self, count, first_step, last_step)
        except Exception as exc:
            (OUT / f"stop.{RANK}.json").write_text(json.dumps({"step": last_step, "message": str(exc)}))
            raise

    def fit(self, *args, **kwargs):
        result = _fit(self, *args, **kwargs)
        state = self.model.state_dict()
        digest = hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes()
                                         for k in sorted(state))).hexdigest()
        finite = all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())
        (OUT / f"fit.{RANK}.json").write_text(json.dumps({"step": self.step, "params": digest,
                                                          "finite": finite, "skipped": result.nonfinite_steps}))
        return result

    Transformer.loss, NonFiniteGuard.check, Trainer.fit = loss, check, fit
''')


def _train(tmp_path: Path, policy: str, clip: str = "0") -> tuple[subprocess.CompletedProcess, Path]:
    """``--nproc 2`` for 6 steps; ``clip`` > 0 computes the (all-reduced, so NaN on both ranks) grad norm."""
    marks = tmp_path / policy
    marks.mkdir()
    (tmp_path / "nan_on_rank_1.py").write_text(NAN_ON_RANK_1)
    env = {**os.environ, "NAN_DIR": str(marks), "NAN_STEP": str(NAN_STEP), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "hotloop", "train", "--nproc", "2", "--import", str(tmp_path / "nan_on_rank_1.py"),
         "--max-steps", "6", "--eval-every", "0", "--on-nonfinite", policy, "--loggers", "none",
         "--override", "batch_size=8,train_examples=96,eval_examples=16,hidden_size=16,filter_size=32,num_layers=1,"
                       "num_heads=2,dropout=0.0,max_grad_norm=" + clip,
         "--strategy", "default", "--strategy-override", "data_parallel=allreduce,prefetch=0,sync_every=1",
         "--output-dir", str(tmp_path / f"run_{policy}")],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=170)
    return proc, marks


def _read(marks: Path, kind: str) -> dict[str, dict]:
    return {rank: json.loads((marks / f"{kind}.{rank}.json").read_text())
            for rank in ("0", "1") if (marks / f"{kind}.{rank}.json").exists()}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("clip", ["0", "1.0"], ids=["no_clip", "clip"])
def test_stop_halts_both_ranks_at_the_same_step_and_names_the_other_rank(tmp_path, clip):
    proc, marks = _train(tmp_path, "stop", clip)
    assert proc.returncode != 0, proc.stdout[-2000:]
    stops = _read(marks, "stop")
    assert set(stops) == {"0", "1"}, proc.stderr[-3000:]
    assert stops["0"]["step"] == stops["1"]["step"] == NAN_STEP          # sync_every=1: read at that step
    assert f"at step {NAN_STEP}" in stops["1"]["message"]                # the rank whose loss was NaN
    # without clipping rank 0 saw only finite values itself; with it, the all-reduced norm is NaN there too
    own = "on another rank" if clip == "0" else f"at step {NAN_STEP}"
    assert own in stops["0"]["message"]
    assert all("(detected in steps 3-3, 1 non-finite step(s))" in s["message"] for s in stops.values())
    assert "hotloop: error: non-finite loss or gradient" in proc.stderr
    assert _read(marks, "fit") == {}                                       # neither rank went on training


@pytest.mark.timeout(200)
def test_skip_keeps_both_ranks_in_step(tmp_path):
    proc, marks = _train(tmp_path, "skip", clip="1.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fits = _read(marks, "fit")
    assert set(fits) == {"0", "1"}, proc.stderr[-3000:]
    assert fits["0"]["step"] == fits["1"]["step"] == 6
    assert fits["0"]["finite"] and fits["1"]["finite"]
    assert fits["0"]["params"] == fits["1"]["params"]                       # the same update discarded on both
    assert fits["0"]["skipped"] == fits["1"]["skipped"] == 1                # one step, counted once
    assert "skipped 1 non-finite step(s)" in proc.stdout, proc.stdout[-2000:]
