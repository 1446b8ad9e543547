"""Stop signals during autotuning and during datagen: the command ends at the next trial step (tuning)
or at once (datagen), exits 128 + signal with one line, leaves no process behind and no data that a
later run would trust."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO

from hotloop.data.shards import manifest_matches

pytestmark = pytest.mark.timeout(240)

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6")

#: every trial step takes at least 0.2 s and says so on stderr
SLOW_TRIALS = '''
import sys, time
from hotloop.tools import trials
_real = trials.TrialRunner.step
def step(self, trial):
    print("TRIAL STEP", file=sys.stderr, flush=True)
    time.sleep(0.2)
    return _real(self, trial)
trials.TrialRunner.step = step
'''

#: a problem whose datagen writes 40 shards, each stopping half-written for 0.3 s
SLOW_SHARDS = '''
import sys, time
import numpy as np
from hotloop.data import shards
from hotloop.problems.prepared import PreparedProblem
from hotloop.registry import problems
_save = np.save
def slow_save(handle, array, **kwargs):
    handle.write(b"half")
    handle.flush()
    print("MID SHARD", file=sys.stderr, flush=True)
    time.sleep(0.3)
    handle.seek(0)
    _save(handle, array, **kwargs)
shards.np.save = slow_save
@problems.register("slow_shards")
class SlowShards(PreparedProblem):
    config = {"format": "slow-v1"}
    def _generate(self):
        writer = shards.ShardWriter(self.data_dir, self.name, self.config)
        for i in range(40):
            writer.add_array(f"shard{i}.npy", np.arange(1000) + i)
        writer.finish({})
'''


def _start(tmp_path: Path, argv: list[str], plugin: str, tag: str) -> subprocess.Popen:
    (tmp_path / "plugin.py").write_text(plugin)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "HOTLOOP_CACHE_DIR": str(tmp_path / "cache"), "STOP_TEST_TAG": tag}
    return subprocess.Popen([sys.executable, "-m", "hotloop", *argv, "--import", str(tmp_path / "plugin.py")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, marker: str, count: int) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + 150
    while sum(marker in line for line in lines) < count:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-3000:]
        lines.append(proc.stderr.readline())
    return lines


def _tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` (the command and anything it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"STOP_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _stop(proc: subprocess.Popen, signum: int, tag: str) -> str:
    start = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 30, "the stop took longer than a scheduler's grace period"
    assert proc.returncode == 128 + signum, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and f"hotloop: interrupted ({signal.Signals(signum).name})" in err, err[-3000:]
    assert not _tagged_processes(tag), "a process of the stopped command is still running"
    return err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_stop_signal_during_tuning_ends_it_at_the_next_trial(tmp_path, signum):
    tag = uuid.uuid4().hex
    proc = _start(tmp_path, ["train", "--override", TINY, "--max-steps", "100000", "--strategy", "auto",
                             "--output-dir", "run", "--loggers", "jsonl"], SLOW_TRIALS, tag)
    _wait_for(proc, "TRIAL STEP", 3)          # tuning has started (a 60 s budget: far from done)
    err = _stop(proc, signum, tag)
    assert err.count("TRIAL STEP") <= 2       # at most the step running when the signal came, then one check
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_datagen_leaves_nothing_a_later_run_trusts(tmp_path, signum):
    tag = uuid.uuid4().hex
    data = tmp_path / "data"
    proc = _start(tmp_path, ["datagen", "--problem", "slow_shards", "--data-dir", str(data), "--raw-dir", str(tmp_path)],
                  SLOW_SHARDS, tag)
    _wait_for(proc, "MID SHARD", 3)           # the third shard is half-written now
    _stop(proc, signum, tag)
    assert sorted(p.name for p in data.iterdir()) == ["shard0.npy", "shard1.npy"]   # no .tmp, no manifest
    assert not manifest_matches(data, "slow_shards", {"format": "slow-v1"})
