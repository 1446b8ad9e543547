"""``hotloop train --nproc 2`` end to end on the default problem, through a crash and a torchrun restart.

A user module (``--import``) makes rank 1's train reader raise at step 3 of the
first attempt; ``--max-restarts 1`` restarts the group, which resumes from the
step-2 checkpoint and finishes. (The error message of a job without restarts
is tested at the launcher level in test_dp_launch.py.)
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hotloop.train.checkpoint import CheckpointManager, load_checkpoint

REPO = Path(__file__).resolve().parents[2]

CRASH_ONCE = textwrap.dedent('''
    """Rank 1's train reader of the default problem raises at batch 3 of torchrun attempt 0;
    on a restart, rank 0 records where its reader started (3 after a resume from step 2)."""
    import os, sys
    from pathlib import Path
    sys.path.insert(0, os.environ["HOOKS_DIR"])
    from reader_hooks import install

    def crash_once(reader):
        attempt, rank = os.environ.get("TORCHELASTIC_RESTART_COUNT"), os.environ.get("RANK")
        marks = Path(os.environ["CRASH_DIR"])
        produced = reader.state_dict()["index"]   # batches of this epoch so far
        if attempt != "0" and rank == "0" and not (marks / "restart_first_batch").exists():
            (marks / "restart_first_batch").write_text(str(produced))
        if produced == 3 and rank == "1" and attempt == "0":
            (marks / "crashed").write_text("crashed")
            raise RuntimeError("injected reader failure")

    install(crash_once)
''')



@pytest.mark.timeout(150)
def test_nproc_2_default_problem_crash_restart_resume(tmp_path: Path) -> None:
    (tmp_path / "crash_once.py").write_text(CRASH_ONCE)
    out = tmp_path / "run"
    env = {**os.environ, "CRASH_DIR": str(tmp_path), "HOOKS_DIR": str(Path(__file__).parent),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "hotloop", "train", "--nproc", "2", "--max-restarts", "1",
         "--import", str(tmp_path / "crash_once.py"), "--max-steps", "4", "--eval-every", "2",
         "--override", "batch_size=8,train_examples=64,eval_examples=16", "--strategy", "default",
         "--strategy-override", "data_parallel=reduce,prefetch=0", "--output-dir", str(out)],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("done: 4 steps") == 1, proc.stdout     # only rank 0 reports
    assert (tmp_path / "crashed").exists()                         # attempt 0 crashed at step 3
    assert (tmp_path / "restart_first_batch").read_text() == "3"    # attempt 1 resumed after step 2
    steps = CheckpointManager(out / "checkpoints").steps()
    assert max(steps) == 4
    assert load_checkpoint(CheckpointManager(out / "checkpoints").latest())["meta"]["step"] == 4
