"""Worker processes for ``Reader.map(fn, workers=N)``.

Design (robust where Paddle's blocking queue was not):

* each worker has its own task queue (``multiprocessing.Queue``: the parent
  never blocks on a put) and its own result pipe, so tasks given round-robin
  come back in order without any shared lock a dying worker could hold;
* the parent waits on the result pipes *and* every worker's process sentinel,
  so a worker killed by the OS is reported within the poll interval;
* an exception in ``fn`` travels back as its formatted traceback and is
  raised in the parent as :class:`WorkerError`;
* workers ignore SIGINT (the parent decides), exit within about a second when
  their parent dies (its sentinel closes or its pid is gone or a zombie), and
  are stopped by ``close()``, by a ``weakref.finalize`` and at interpreter exit.

The default start method is ``forkserver`` (``spawn`` where unavailable): no
fork of a process that runs threads or torch's thread pools. ``fn`` must then
be picklable (a module-level function); ``mp_context="fork"`` allows closures.
"""
from __future__ import annotations

import collections
import itertools
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import queue
import signal
import sys
import traceback
import weakref
from typing import Any, Callable, Iterator

from .errors import WorkerError

__all__ = ["WorkerPool", "default_context"]

POLL_S = 0.2  # how often a waiting parent re-checks worker liveness


def default_context() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed, not yet reaped parent)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:                       # no procfs: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def _worker_main(fn: Callable[[Any], Any], tasks: Any, results: Any, parent_pid: int | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    parent = mp.parent_process()
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            # parent_process()'s sentinel alone is not enough: a sibling forked later (another
            # pool with mp_context="fork") inherits the sentinel's other end and keeps it open
            if (parent is not None and not parent.is_alive()) or (
                    parent_pid is not None and not _pid_alive(parent_pid)):
                return
            continue
        if task is None:
            return
        run_id, seq, chunk = task
        done: list[Any] = []
        try:
            for item in chunk:
                done.append(fn(item))
            message = ("ok", run_id, seq, done)
        except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
            message = ("err", run_id, seq, (len(done), traceback.format_exc()))
        try:
            results.send(message)
        except (BrokenPipeError, EOFError, ConnectionError):
            return
        except Exception:  # noqa: BLE001 - e.g. an unpicklable result
            results.send(("err", run_id, seq, (0, "cannot send the result back:\n" + traceback.format_exc())))


def _shutdown(procs: list[Any], task_queues: list[Any], conns: list[Any]) -> None:
    for q in task_queues:
        try:
            q.put(None)
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(timeout=1.0)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=1.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=1.0)
    for q in task_queues:
        q.cancel_join_thread()  # never hang at exit on items a dead worker did not read
        q.close()
    for c in conns:
        c.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is unresponsive"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class WorkerPool:
    """``num_workers`` processes applying ``fn``; ``imap`` streams results (ordered by default)."""

    def __init__(self, fn: Callable[[Any], Any], num_workers: int, *, mp_context: str | None = None,
                 inflight: int = 2, chunksize: int = 1) -> None:
        if num_workers < 1 or inflight < 1 or chunksize < 1:
            raise ValueError(f"num_workers={num_workers}, inflight={inflight} and chunksize={chunksize} "
                             "must be >= 1")
        ctx = mp.get_context(mp_context or default_context())
        if ctx.get_start_method() == "forkserver":
            # import the heavy modules once in the fork server, not in every worker
            ctx.set_forkserver_preload(["__main__", "numpy", "torch", "hotloop.data.workers"])
        self.num_workers, self.inflight, self.chunksize = num_workers, inflight, chunksize
        self.broken = False
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._conns: list[Any] = []
        self._outstanding = [0] * num_workers
        self._run_id = 0
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._tasks, self._conns)
        try:
            for i in range(num_workers):
                tasks = ctx.Queue()
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker_main, args=(fn, tasks, send, os.getpid()), daemon=True,
                                   name=f"hotloop-data-worker-{i}")
                self._tasks.append(tasks)
                self._conns.append(recv)
                proc.start()
                self._procs.append(proc)
                send.close()  # the child holds the write end; EOF tells us it is gone
        except Exception as exc:
            self.close()
            hint = ""
            if "pickle" in str(exc).lower():
                hint = ("; with the 'spawn'/'forkserver' start method the map function must be a "
                        "module-level function (or pass mp_context='fork')")
            raise WorkerError(f"could not start data workers: {exc}{hint}") from exc

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop every worker (graceful, then terminate, then kill). Idempotent."""
        self.broken = True
        self._finalizer()

    def _check_alive(self, ready: list[Any]) -> None:
        """Workers only exit when closed, so any finished worker during ``imap`` is a failure."""
        sentinels = {p.sentinel: i for i, p in enumerate(self._procs)}
        for obj in ready:
            if obj in sentinels:
                self._fail(sentinels[obj])

    def _fail(self, i: int) -> None:
        proc = self._procs[i]
        proc.join(timeout=0.5)
        reason = _describe_exit(proc.exitcode)
        self.close()
        raise WorkerError(f"data worker {i} (pid {proc.pid}) {reason} while processing items; "
                          "the OS may have killed it (out of memory?); the input pipeline is stopped")

    def _receive(self, i: int, run_id: int) -> tuple[str, int, Any]:
        """The next current-run message from worker ``i`` (stale ones are dropped)."""
        while True:
            ready = mpc.wait([self._conns[i]] + [p.sentinel for p in self._procs], timeout=POLL_S)
            if self._conns[i] in ready:
                try:
                    kind, rid, seq, payload = self._conns[i].recv()
                except (EOFError, OSError):
                    self._fail(i)
                self._outstanding[i] -= 1
                if rid == run_id:
                    return kind, seq, payload
                continue
            self._check_alive(ready)

    def _raise_task_error(self, i: int, seq: int, error: tuple[int, str]) -> None:
        offset, text = error
        raise WorkerError(f"the map function raised in data worker {i} (pid {self._procs[i].pid}) "
                          f"on item {seq * self.chunksize + offset} of this pass:\n{text.rstrip()}")

    def imap(self, items: Iterator[Any], *, ordered: bool = True) -> Iterator[Any]:
        """Apply ``fn`` to ``items``, sent in chunks of ``chunksize``; at most ``inflight``
        chunks per worker are outstanding."""
        if self.broken:
            raise WorkerError("the worker pool is closed")
        self._run_id += 1
        run_id, n = self._run_id, self.num_workers
        pending: collections.deque[tuple[int, int]] = collections.deque()  # (seq, worker) in send order
        seq, exhausted = 0, False
        while True:
            while not exhausted and len(pending) < n * self.inflight:
                chunk = list(itertools.islice(items, self.chunksize))
                if len(chunk) < self.chunksize:
                    exhausted = True
                    if not chunk:
                        break
                worker = seq % n if ordered else min(range(n), key=self._outstanding.__getitem__)
                self._tasks[worker].put((run_id, seq, chunk))
                self._outstanding[worker] += 1
                pending.append((seq, worker))
                seq += 1
            if not pending:
                return
            if ordered:
                want, worker = pending.popleft()
                kind, got, payload = self._receive(worker, run_id)
                assert got == want, f"worker {worker} answered item {got}, expected {want}"
            else:
                kind, got, payload, worker = self._receive_any(run_id, pending)
            if kind == "err":
                self._raise_task_error(worker, got, payload)
            yield from payload

    def _receive_any(self, run_id: int, pending: collections.deque) -> tuple[str, int, Any, int]:
        busy = sorted({w for _, w in pending})
        while True:
            conns = [self._conns[w] for w in busy]
            ready = mpc.wait(conns + [p.sentinel for p in self._procs], timeout=POLL_S)
            for w in busy:
                if self._conns[w] in ready:
                    kind, seq, payload = self._receive(w, run_id)
                    pending.remove(next(e for e in pending if e[0] == seq))
                    return kind, seq, payload, w
            self._check_alive(ready)
