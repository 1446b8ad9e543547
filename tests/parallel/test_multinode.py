"""Two "nodes" on this machine: two ``hotloop train --nnodes 2`` launchers over loopback (gloo).

The job trains; node 1 is killed (its whole process group, SIGKILL, as when a machine dies);
node 0 notices and waits for the job to re-form; node 1 starts again with the same command;
the re-formed job resumes from the last checkpoint and finishes. No process is left behind.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hotloop.cli.cli_support import job_nodes, restart_resume
from hotloop.errors import UserError
from hotloop.parallel.nodes import first_host, node_spec
from hotloop.train.checkpoint import CheckpointManager, load_checkpoint

REPO = Path(__file__).resolve().parents[2]

SLOW_READER = textwrap.dedent('''
    """The default problem's train reader, slowed per batch; each process records where it starts."""
    import os, sys, time
    from pathlib import Path
    sys.path.insert(0, os.environ["HOOKS_DIR"])
    from reader_hooks import install

    started = []

    def slow(reader):
        if not started:
            started.append(True)
            line = f"{os.environ['RANK']} {os.getpid()} {reader.state_dict()['index'] - 1}\\n"
            with open(Path(os.environ["MARK_DIR"]) / "starts.txt", "a") as f:
                f.write(line)
        time.sleep(0.25)

    install(slow)
''')



def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pids_with(marker: str) -> list[int]:
    """Live processes whose command line or environment mentions ``marker`` (this test's run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in blob and state != "Z":
            found.append(int(entry.name))
    return found


def _wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.mark.timeout(240)
def test_two_nodes_loopback_node_killed_and_restarted_resumes(tmp_path: Path) -> None:
    (tmp_path / "slow_reader.py").write_text(SLOW_READER)
    out = tmp_path / "run"
    marker = f"hotloop-multinode-{tmp_path.name}"
    env = {**os.environ, "MARK_DIR": str(tmp_path), "HOTLOOP_TEST_MARKER": marker,
           "HOOKS_DIR": str(Path(__file__).parent),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    common = [sys.executable, "-m", "hotloop", "train", "--nnodes", "2",
              "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", marker, "--max-restarts", "1",
              "--import", str(tmp_path / "slow_reader.py"), "--max-steps", "24", "--eval-every", "4",
              "--override", "batch_size=8,train_examples=512,eval_examples=16", "--strategy", "default",
              "--strategy-override", "prefetch=0", "--output-dir", str(out), "--resume"]

    def start(rank: int, tag: str) -> subprocess.Popen:
        log = open(tmp_path / f"{tag}.log", "w")
        return subprocess.Popen([*common, "--node-rank", str(rank)], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    node0 = start(0, "node0")
    node1 = start(1, "node1")
    try:
        ckpts = CheckpointManager(out / "checkpoints", writer=False)
        _wait_for(lambda: any(s >= 4 for s in ckpts.steps()), 120, "the first checkpoint")
        assert node1.poll() is None and node0.poll() is None, "the job ended before a node could be killed"
        os.killpg(node1.pid, signal.SIGKILL)            # node 1 dies with all its processes
        node1.wait(10)
        killed_at = time.monotonic()
        log0 = tmp_path / "node0.log"
        # the agent logs its worker's failure ("Connection closed by peer") and restarts the group
        detected = _wait_for(lambda: "failed (exitcode" in log0.read_text(), 60, "node 0 to notice")
        assert node0.poll() is None, "node 0 gave up instead of waiting for the job to re-form"
        node1 = start(1, "node1_again")
        assert node0.wait(150) == 0, log0.read_text()[-3000:]
        assert node1.wait(30) == 0, (tmp_path / "node1_again.log").read_text()[-3000:]
        print(f"node death noticed {detected:.1f} s after the kill; job finished "
              f"{time.monotonic() - killed_at:.1f} s after it")
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    steps = CheckpointManager(out / "checkpoints").steps()
    assert max(steps) == 24
    assert load_checkpoint(CheckpointManager(out / "checkpoints").latest())["meta"]["step"] == 24
    starts = [line.split() for line in (tmp_path / "starts.txt").read_text().splitlines()]
    first_round = {int(rank): int(index) for rank, _, index in starts[:2]}
    resumed = [int(index) for _, _, index in starts[2:]]
    assert first_round == {0: 0, 1: 0}, starts
    assert len(resumed) == 2 and resumed[0] == resumed[1] and 4 <= resumed[0] < 24, starts  # both from one checkpoint
    _wait_for(lambda: not _pids_with(marker), 10, "no process of the job left")


def test_node_flags_and_slurm_environment() -> None:
    spec = node_spec({"--nnodes": "2", "--node-rank": "1", "--rdzv-endpoint": "10.0.0.5:29400",
                      "--rdzv-id": "job7"}, environ={})
    assert (spec.min_nodes, spec.max_nodes, spec.node_rank, spec.endpoint, spec.run_id) == (2, 2, 1,
                                                                                            "10.0.0.5:29400", "job7")
    assert node_spec({"--nnodes": "1:4", "--node-rank": "0", "--rdzv-endpoint": "h",
                      "--rdzv-id": "j"}, environ={}).nnodes_arg == "1:4"
    assert node_spec({}, environ={}) is None
    for flags, words in [({"--nnodes": "2", "--node-rank": "0", "--rdzv-id": "j"}, "--rdzv-endpoint"),
                         ({"--nnodes": "2", "--rdzv-endpoint": "h:1", "--rdzv-id": "j"}, "--node-rank"),
                         ({"--nnodes": "2", "--node-rank": "2", "--rdzv-endpoint": "h:1", "--rdzv-id": "j"},
                          "not in [0, 2)"),
                         ({"--nnodes": "2", "--node-rank": "0", "--rdzv-endpoint": "h:1"}, "--rdzv-id"),
                         ({"--nnodes": "two"}, "N or MIN:MAX"), ({"--node-rank": "1"}, "need --nnodes"),
                         ({"--nnodes": "2", "--node-rank": "0", "--rdzv-endpoint": "h:99999", "--rdzv-id": "j"},
                          "HOST:PORT")]:
        with pytest.raises(UserError, match=words.replace("[", r"\[").replace(")", r"\)")):
            node_spec(flags, environ={})
    slurm = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NUM_TASKS": "3",
             "SLURM_NODEID": "2", "SLURM_STEP_NODELIST": "gpu[07-09]", "SLURM_JOB_ID": "4242"}
    spec = node_spec({}, environ=slurm)
    assert (spec.max_nodes, spec.node_rank, spec.endpoint, spec.run_id, spec.source) == (
        3, 2, "gpu07:29500", "slurm-4242-0", "slurm")
    assert node_spec({"--nnodes": "1"}, environ=slurm) is None          # a flag wins over Slurm
    with pytest.raises(UserError, match="one hotloop task per node"):
        node_spec({}, environ={**slurm, "SLURM_STEP_NUM_TASKS": "24"})
    assert node_spec({}, environ={**slurm, "SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "1"}) is None
    assert [first_host(n) for n in ("node01", "a[3-5,9],b2", "rack1-n[001-004]")] == ["node01", "a3", "rack1-n001"]
    assert job_nodes(["train", "--nnodes=2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                      "--rdzv-id", "x"]).endpoint == "h:1"


def test_collective_timeout_default_and_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.cli import main
    from hotloop.parallel.group import default_timeout_s
    monkeypatch.delenv("HOTLOOP_DIST_TIMEOUT_S", raising=False)
    assert default_timeout_s() == 1800.0          # outlasts a rank-0 checkpoint write of a large model
    assert main(["train", "--nproc", "2", "--dist-timeout", "0"]) == 2
    assert main(["train", "--nproc", "2", "--dist-timeout", "soon"]) == 2


def test_multi_node_restarts_resume_on_every_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("HOTLOOP_ELASTIC", raising=False)
    assert restart_resume(False, True) is False                 # a first attempt keeps the user's choice
    monkeypatch.setenv("HOTLOOP_ELASTIC", "1")                  # a node that rejoins a multi-node job
    assert restart_resume(False, True) is True
    assert restart_resume(True, False) is False
