"""Worker processes: order, resume, exceptions, killed workers, shutdown (no orphans, no hang)."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hotloop.data import ReaderError, WorkerError, from_arrays, prefetch

ROOT = Path(__file__).resolve().parents[2]


def _square(item):
    return {"x": np.array([int(item) ** 2]), "pid": np.array([os.getpid()])}


def _slow_square(item):
    time.sleep(0.01)
    return _square(item)


def _fail_on_7(item):
    if int(item) == 7:
        raise ValueError(f"worker cannot handle item {int(item)}")
    return _square(item)


def _no_children():
    deadline = time.monotonic() + 5
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not mp.active_children()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):   # gone before the open, or between open and read
        return False


def _chain(fn=_square, workers=2, n=40):
    return from_arrays(np.arange(n)).shuffle(16, seed=3).map(fn, workers=workers).batch(4)


@pytest.mark.timeout(60)
def test_workers_keep_order_persist_across_epochs_and_close():
    expected = [b["x"].tolist() for b in _chain(workers=0)]
    reader = _chain()
    first = list(reader)
    assert [b["x"].tolist() for b in first] == expected
    pids = {int(p) for b in first for p in b["pid"].flatten()}
    assert len(pids) == 2 and os.getpid() not in pids
    reader.set_epoch(0)
    again = list(reader)
    assert [b["x"].tolist() for b in again] == expected
    assert {int(p) for b in again for p in b["pid"].flatten()} == pids   # same processes reused
    reader.close()
    assert _no_children()


@pytest.mark.timeout(60)
def test_chunked_map_keeps_order_and_names_the_failing_item():
    reader = from_arrays(np.arange(45)).map(_square, workers=2, chunksize=4)
    assert [int(d["x"][0]) for d in reader] == [i * i for i in range(45)]
    reader.close()
    with pytest.raises(WorkerError, match=r"(?s)on item 7 of this pass.*worker cannot handle item 7"):
        list(from_arrays(np.arange(20)).map(_fail_on_7, workers=2, chunksize=3))
    assert _no_children()


@pytest.mark.timeout(60)
def test_unordered_map_yields_every_item():
    reader = from_arrays(np.arange(30)).map(_square, workers=2, ordered=False)
    got = sorted(int(d["x"][0]) for d in reader)
    reader.close()
    assert got == [i * i for i in range(30)]


@pytest.mark.timeout(60)
def test_resume_through_workers_and_prefetch():
    expected = [b["x"].tolist() for b in _chain(workers=0)]
    fed = prefetch(_chain(), capacity=3)
    it = iter(fed)
    got = [next(it)["x"].tolist() for _ in range(4)]
    state = fed.state_dict()
    it.close()
    assert state == {"epoch": 0, "position": 4} and _no_children()
    resumed = prefetch(_chain(), capacity=3)
    resumed.load_state_dict(state)
    rest = [b["x"].tolist() for b in resumed]
    resumed.close()
    assert got + rest == expected and _no_children()


@pytest.mark.timeout(30)
def test_worker_exception_reraised_with_traceback_and_no_orphans():
    with pytest.raises(WorkerError) as info:
        list(_chain(_fail_on_7))
    text = str(info.value)
    assert "worker cannot handle item 7" in text and "_fail_on_7" in text and "Traceback" in text
    assert _no_children()
    with pytest.raises(ReaderError, match="worker cannot handle item 7"):   # through prefetch too
        list(prefetch(_chain(_fail_on_7), capacity=2))
    assert _no_children()


@pytest.mark.timeout(30)
def test_killed_worker_is_a_clear_error_within_seconds():
    reader = from_arrays(np.arange(5000)).map(_slow_square, workers=2)
    it = iter(reader)
    next(it)
    victim = reader._pool.pids[0]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"SIGKILL") as info:
        for _ in it:
            pass
    waited = time.monotonic() - killed_at
    assert waited < 5.0, f"the killed worker was reported after {waited:.1f} s"   # poll interval: 0.2 s
    assert str(victim) in str(info.value)
    assert _no_children()


@pytest.mark.timeout(30)
def test_break_and_exception_in_step_stop_workers_and_threads():
    for _ in _chain(_slow_square):
        break
    assert _no_children()
    fed = prefetch(_chain(_slow_square), capacity=2)
    with pytest.raises(RuntimeError, match="step failed"):
        for index, _ in enumerate(fed):
            if index == 2:
                raise RuntimeError("step failed")
    assert _no_children()
    assert not [t for t in threading.enumerate() if t.name == "hotloop-prefetch"]


@pytest.mark.timeout(30)
def test_unpicklable_function_is_a_clear_error():
    with pytest.raises(WorkerError, match="module-level function"):
        list(from_arrays(np.arange(4)).map(lambda x: x, workers=1, mp_context="spawn"))
    assert _no_children()
    reader = from_arrays(np.arange(4)).map(lambda x: int(x) + 1, workers=1, mp_context="fork")
    assert list(reader) == [1, 2, 3, 4]
    reader.close()
    assert _no_children()


_SCRIPT = textwrap.dedent("""
    import faulthandler, signal, sys, time
    import numpy as np
    from hotloop.data import from_arrays, prefetch


    def slow(item):
        time.sleep(0.01)
        return np.array([int(item)])


    def pipeline(context):
        reader = from_arrays(np.arange(100000)).map(slow, workers=2, mp_context=context).batch(4)
        return prefetch(reader, capacity=2)


    if __name__ == "__main__":
        # a shell's background job inherits SIGINT ignored; Ctrl-C at a terminal is not ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        faulthandler.register(signal.SIGUSR1, all_threads=True)   # the test's report if this hangs
        left_open = pipeline("fork")        # never closed: must end with the interpreter
        left_it = iter(left_open)
        next(left_it)
        interrupted = pipeline("forkserver")
        it = iter(interrupted)
        next(it)
        pids = left_open.reader.upstream._pool.pids + interrupted.reader.upstream._pool.pids
        print("PIDS", *pids, flush=True)
        for batch in it:                    # until Ctrl-C
            time.sleep(0.01)
""")


@pytest.mark.timeout(90)
def test_ctrl_c_and_interpreter_exit_leave_no_orphans(tmp_path):
    """Ctrl-C in a child interpreter iterating one pipeline while another is left open:
    the child ends promptly and every worker of both pipelines is gone."""
    script = tmp_path / "pipeline.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), proc.stderr.read()
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 4 and all(_alive(p) for p in pids)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        try:   # communicate, not wait: the child and its workers write to pipes that must not fill up
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)          # the child's faulthandler prints every thread
            time.sleep(1.0)
            proc.kill()
            pytest.fail("the child did not end within 60 s of Ctrl-C; its threads:\n" + proc.communicate()[1][-6000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


_ORPHAN_SCRIPT = textwrap.dedent("""
    import time
    import numpy as np
    from hotloop.data import from_arrays


    def slow(item):
        time.sleep(0.01)
        return np.array([int(item)])


    if __name__ == "__main__":
        pids, keep = [], []
        for context in ("forkserver", "fork"):
            reader = from_arrays(np.arange(100000)).map(slow, workers=2, mp_context=context)
            it = iter(reader)
            next(it)
            pids += reader._pool.pids
            keep.append((reader, it))          # alive, not consumed: the workers sit idle
        print("PIDS", *pids, flush=True)
        time.sleep(600)
""")


@pytest.mark.timeout(60)
def test_workers_exit_soon_after_the_parent_is_killed(tmp_path):
    """SIGKILL the parent (no finalizer, no atexit can run): its workers notice and exit."""
    script = tmp_path / "orphans.py"
    script.write_text(_ORPHAN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), proc.stderr.read()
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 4 and all(_alive(p) for p in pids)
        time.sleep(1.5)                      # the workers are idle, waiting on their task queues
        killed_at = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    while any(_alive(p) for p in pids) and time.monotonic() - killed_at < 10:
        time.sleep(0.02)
    gone_after = time.monotonic() - killed_at
    left = [p for p in pids if _alive(p)]
    for pid in left:                         # do not leak them into the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left and gone_after < 2.0, f"workers {left or pids} still alive {gone_after:.2f} s after"
