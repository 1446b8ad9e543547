"""Preemption: SIGTERM at random moments, restart with --resume, same final weights (bitwise, CPU fp32)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import run_in_fresh_process, REPO

pytestmark = pytest.mark.timeout(300)

TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2,dropout=0.1")
STEPS = 200


def _command(out: Path) -> list[str]:
    return [sys.executable, "-m", "hotloop", "train", "--override", TINY, "--output-dir", str(out),
            "--max-steps", str(STEPS), "--eval-every", "0", "--strategy", "default",
            "--strategy-override", "sync_every=2", "--loggers", "jsonl", "--resume"]


def _env() -> dict[str, str]:
    # one thread: the same kernels in every process, and less load on a shared machine
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _last_step(metrics: Path) -> int:
    """The step of the last complete training row (0 before the first)."""
    if not metrics.is_file():
        return 0
    lines = [line for line in metrics.read_text().splitlines() if line.endswith("}")]
    steps = [json.loads(line)["step"] for line in lines if '"split": "train"' in line]
    return steps[-1] if steps else 0


def _final_state(out: Path) -> dict[str, torch.Tensor]:
    payload = torch.load(out / "checkpoints" / f"step-{STEPS:08d}.ckpt", weights_only=True)
    state = {f"model.{k}": v for k, v in payload["model"].items()}
    for index, entry in payload["optimizer"]["state"].items():
        state.update({f"opt.{index}.{k}": v for k, v in entry.items() if isinstance(v, torch.Tensor)})
    return state


def test_sigterm_five_times_then_resume_is_bitwise(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    reference = subprocess.Popen(_command(tmp_path / "straight"), cwd=tmp_path, env=_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "preempted"
    metrics = out / "metrics.jsonl"
    # five kill points spread over the run: once a run has logged past its target step, it gets
    # SIGTERM after a random delay (mid-step, mid-evaluation or mid-checkpoint)
    targets = sorted(rng.sample(range(10, 150, 2), 5))
    for target in targets:
        start = _last_step(metrics)
        proc = subprocess.Popen(_command(out), cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while (_last_step(metrics) < target or _last_step(metrics) <= start) and proc.poll() is None:
            assert time.monotonic() < deadline, "no training progress"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, f"seed {seed}: exit {proc.returncode}: {err[-2000:]}"
        assert "interrupted at step" in err and "Traceback" not in err, err[-2000:]
    final = subprocess.run(_command(out), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"done: {STEPS} steps" in final.stdout
    _, err = reference.communicate(timeout=180)
    assert reference.returncode == 0, err[-3000:]
    a, b = _final_state(tmp_path / "straight"), _final_state(out)
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"seed {seed}: interrupted run differs in {differing[:5]}"


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, capsys):
    from hotloop import cli
    out = tmp_path / "r"
    code = cli.main(["train", "--override", TINY, "--output-dir", str(out), "--max-steps", "2",
                     "--strategy", "default", "--resume"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    notices = [line for line in captured.out.splitlines() if line.startswith("resume:")]
    assert notices == [f"resume: no checkpoint in {out / 'checkpoints'} yet; starting from step 0"]
    assert (out / "checkpoints" / "step-00000002.ckpt").is_file()


def _workers(launcher: int) -> dict[int, int]:
    """rank -> pid of the torchrun workers under ``launcher`` (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if parent == launcher and b"RANK" in env and b"TORCHELASTIC_RUN_ID" in env:
            found[int(env[b"RANK"])] = int(entry.name)
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the workers through /proc")
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    out = tmp_path / "dp"
    command = _command(out)[:-1] + ["--nproc", "2", "--max-steps", "100000"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 150
        while _last_step(out / "metrics.jsonl") < 4:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        workers = _workers(proc.pid)
        assert sorted(workers) == [0, 1]
        os.kill(workers[1], signal.SIGTERM)          # only rank 1 is told to stop
        _, err = proc.communicate(timeout=120)        # a rank left waiting in a collective would hang here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert "interrupted at step" in err and "Traceback" not in err, err[-3000:]
    steps = sorted(int(p.name[5:13]) for p in (out / "checkpoints").glob("step-*.dcp"))   # 2 ranks: sharded
    stopped_at = steps[-1]
    assert stopped_at % 2 == 0        # taken at a sync point (sync_every=2), by both ranks together
    assert _last_step(out / "metrics.jsonl") <= stopped_at


class _SignalAt:
    """Sends ``signum`` to this process after step ``step`` (twice with ``twice``)."""

    def __init__(self, step: int, signum: int, twice: bool = False) -> None:
        self.step, self.signum, self.twice = step, signum, twice

    def on_event(self, event, trainer, **info):
        from hotloop.train import Event
        if event is Event.STEP_END and trainer.step == self.step:
            signal.raise_signal(self.signum)      # to this (main) thread, not a native pool thread
            if self.twice:
                signal.raise_signal(self.signum)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    state_key = "SignalAt"


def test_sigusr1_checkpoints_at_the_step_boundary_and_sets_the_exit_code(tmp_path):
    """In a fresh process, as `hotloop train` runs: in the suite's long-lived process a signal sent after
    the OpenVINO decoder test (tests/export/test_seq2seq_graphs.py) ended in a segmentation fault; a
    small OpenVINO script followed by SIGINT does not, so the cause is not pinned down."""
    run_in_fresh_process(_sigusr1_body, tmp_path)


def _sigusr1_body(tmp_path):
    from helpers import make_trainer
    from hotloop.train.interrupt import Interrupted
    previous = signal.getsignal(signal.SIGUSR1)
    trainer = make_trainer(tmp_path / "r", max_steps=10, callbacks=[_SignalAt(3, signal.SIGUSR1)])
    with pytest.raises(Interrupted) as info:
        trainer.fit()
    assert info.value.exit_code == 138 and info.value.signum == signal.SIGUSR1
    assert trainer.step == 3 and trainer.last_checkpoint.name == "step-00000003.ckpt"
    assert signal.getsignal(signal.SIGUSR1) == previous          # the handler is removed again
    # a second signal raises at once, from inside the callback that sent it (not at the step boundary)
    again = make_trainer(tmp_path / "r", max_steps=10, callbacks=[_SignalAt(5, signal.SIGTERM, twice=True)])
    with pytest.raises(Interrupted) as info:
        again.fit(resume=True)
    assert info.value.exit_code == 143 and again.step == 5
    assert any(frame.name == "on_event" for frame in __import__("traceback").extract_tb(info.tb))
