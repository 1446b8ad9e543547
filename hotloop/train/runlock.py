"""One owner per run directory: an exclusive OS lock on ``<output_dir>/.lock``.

``hotloop train`` takes the lock before it writes anything and holds it until it
exits (in a multi-process job only global rank 0 holds it). The lock is an
``fcntl.flock`` on the open file, so the kernel (or the NFS server) releases it
when the process dies: ``kill -9`` leaves nothing stale. The file records the
holder as JSON (pid, host, start time, command, rank) plus a heartbeat that a
daemon thread refreshes every :data:`HEARTBEAT_SECONDS` (``HOTLOOP_LOCK_HEARTBEAT``).

Which file systems are covered:

- **exact**: local file systems (ext4, xfs, btrfs, tmpfs, overlayfs) for the
  processes of one machine; NFSv4, and NFSv3 with its lock manager (Linux maps
  ``flock`` to NFS byte-range locks), Lustre mounted with ``-o flock``,
  GPFS / Spectrum Scale and CephFS across machines (a dead NFS client's lock is
  freed when its lease ends, about 90 s).
- **by heartbeat**: where locks do not reach other machines (NFS mounted
  ``nolock`` or ``local_lock=flock``/``all``, Lustre ``-o localflock``) or
  ``flock`` is not supported at all (some FUSE and SMB mounts), a lock record of
  another host (or of a live process of this host) whose heartbeat is younger than
  :data:`STALE_SECONDS` (``HOTLOOP_LOCK_STALE``) counts as held; an older one
  counts as stale, and taking it over is said in one line. This is best effort:
  two machines that start within one heartbeat of a stale record may both win.

Commands that only read a run (``eval``, ``export``, ``decode``) take no lock.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from ..errors import UserError

__all__ = ["RunLock", "RunLockError", "LOCK_NAME", "HEARTBEAT_SECONDS", "STALE_SECONDS", "read_lock_record",
           "check_unlocked"]

LOCK_NAME = ".lock"
HEARTBEAT_SECONDS = 15.0
STALE_SECONDS = 120.0
_FORMAT = "hotloop-run-lock"
_POLL_SECONDS = 0.25
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL, errno.EBADF}
_HELD_FDS: set[int] = set()


def _close_in_child() -> None:
    """A forked child (a data worker) must not keep the lock alive after its parent dies."""
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunLockError(UserError):
    """The run directory is held by another process; names its pid, host and start time."""


def _seconds(env: str, default: float) -> float:
    try:
        return max(0.05, float(os.environ.get(env, default)))
    except ValueError:
        return default


def read_lock_record(directory: str | Path) -> dict[str, Any] | None:
    """The lock record of run ``directory`` (None: no lock file, or not readable as one)."""
    path = Path(directory) / LOCK_NAME
    for _ in range(3):   # a heartbeat may be rewriting it this instant
        try:
            record = json.loads(path.read_text() or "null")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            time.sleep(0.02)
            continue
        return record if isinstance(record, dict) and record.get("format") == _FORMAT else None
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(record: dict[str, Any] | None) -> str:
    if not record or record.get("pid") is None:
        return "another process (its lock record is not written yet)"
    return f"pid {record.get('pid')} on host {record.get('host')} since {record.get('started')}"


class RunLock:
    """The exclusive lock of one run directory; :meth:`acquire`, then :meth:`release` (or ``with``)."""

    def __init__(self, directory: str | Path, *, command: str = "", rank: int = 0,
                 heartbeat_s: float | None = None, stale_s: float | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self.command = command or " ".join(["hotloop", *sys.argv[1:]])
        self.rank = rank
        self.heartbeat_s = heartbeat_s or _seconds("HOTLOOP_LOCK_HEARTBEAT", HEARTBEAT_SECONDS)
        self.stale_s = stale_s or _seconds("HOTLOOP_LOCK_STALE", STALE_SECONDS)
        self.log = log
        self.host = socket.gethostname()
        self.fd: int | None = None
        self.flock_works = True
        self._record: dict[str, Any] = {}
        self._size = 0
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._io = threading.Lock()

    # ----------------------------------------------------------- deciding
    def _blocker(self, record: dict[str, Any] | None, locked: bool, quiet: bool) -> str | None:
        """Why ``record`` still holds the directory although no OS lock stopped us (None: it does not)."""
        if not record or record.get("released"):
            return None
        pid, host = record.get("pid"), record.get("host")
        if host == self.host and (locked or pid == os.getpid()):
            return None   # flock is exact among the processes of one machine
        if host == self.host and isinstance(pid, int) and not _alive(pid):
            return None   # killed on this machine: the record is left over
        age = time.time() - float(record.get("heartbeat") or 0)
        if age >= self.stale_s:
            if not quiet:
                self.log(f"lock: taking over {self.path} from {_holder(record)}: its heartbeat is {age:.0f} s "
                         f"old (stale after {self.stale_s:.0f} s)")
            return None
        why = ("this file system's locks may not reach other hosts" if host != self.host else
               "this file system does not enforce flock")
        return (f" (its heartbeat is {age:.0f} s old, under the {self.stale_s:.0f} s stale timeout; "
                f"{why}, so the heartbeat decides)")

    def _flock(self, fd: int) -> None:
        """``flock`` without blocking; a holder that has not written its record yet (or a launcher's
        momentary check, which leaves the released record) gets a moment before it counts."""
        for _ in range(5):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                record = read_lock_record(self.directory)
                if record and not record.get("released"):
                    raise
                time.sleep(0.05)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _try(self, fd: int, probe: bool) -> str | None:
        """None when the directory is ours now (or free, for ``probe``); else the refusal message."""
        try:
            self._flock(fd)
            locked = True
        except BlockingIOError:
            return f"run directory {self.directory} is in use by {_holder(read_lock_record(self.directory))}"
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            if self.flock_works:
                self.log(f"lock: {self.path}: the file system does not support flock ({exc.strerror}); "
                         f"the lock relies on its heartbeat alone")
            self.flock_works, locked = False, False
        record = read_lock_record(self.directory)
        why = self._blocker(record, locked, quiet=probe)
        if locked and (why is not None or probe):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return None if why is None else f"run directory {self.directory} is in use by {_holder(record)}{why}"

    # ---------------------------------------------------------- acquiring
    def acquire(self, wait: float = 0.0) -> "RunLock":
        """Take the lock, waiting up to ``wait`` seconds for the holder; raises :class:`RunLockError`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._wait_for(fd, wait, probe=False)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._size = os.fstat(fd).st_size   # a former holder's record: overwritten, padded, never truncated
        _HELD_FDS.add(fd)
        now = time.time()
        self._record = {"format": _FORMAT, "pid": os.getpid(), "host": self.host, "rank": self.rank,
                        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
                        "started_unix": now, "command": self.command, "heartbeat": now,
                        "heartbeat_every_s": self.heartbeat_s, "stale_after_s": self.stale_s,
                        "released": False}
        self._write()
        self._stop = threading.Event()
        if not self.flock_works:   # no OS lock: confirm nobody else wrote a record at the same moment
            time.sleep(min(0.5, self.heartbeat_s))
            record = read_lock_record(self.directory) or {}
            if (record.get("pid"), record.get("host")) != (os.getpid(), self.host):
                self.release(mark=False)
                raise RunLockError(f"run directory {self.directory} is in use by {_holder(record)}")
        self._beat = threading.Thread(target=self._heartbeat, name="hotloop-run-lock", daemon=True)
        self._beat.start()
        return self

    def probe(self, wait: float = 0.0) -> None:
        """Raise :class:`RunLockError` when the directory is held (waiting up to ``wait`` s); writes nothing."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except PermissionError:
            return   # not ours to write: the run itself will report it
        try:
            self._wait_for(fd, wait, probe=True)
        finally:
            os.close(fd)

    def _wait_for(self, fd: int, wait: float, probe: bool) -> None:
        deadline = time.monotonic() + max(0.0, wait)
        refusal = self._try(fd, probe)
        if refusal is not None and wait > 0:
            self.log(f"lock: {refusal}; waiting up to {wait:g} s (--wait-for-lock)")
        while refusal is not None:
            if time.monotonic() >= deadline:
                hint = (f"; still held after waiting {wait:g} s" if wait > 0 else
                        "; wait for it with --wait-for-lock SECONDS or pick another --output-dir")
                raise RunLockError(refusal + hint)
            time.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            refusal = self._try(fd, probe)

    # ------------------------------------------------------------ holding
    def _write(self) -> None:
        """Rewrite the record in place (the flock belongs to this inode; a rename would drop it)."""
        if self.fd is None:
            return
        data = json.dumps(self._record, sort_keys=True).encode()
        data += b" " * max(0, self._size - len(data) - 1) + b"\n"   # never shorter: readers never see a tail
        with self._io:
            os.pwrite(self.fd, data, 0)
            self._size = len(data)
            try:
                os.fsync(self.fd)
            except OSError:
                pass

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self._record["heartbeat"] = time.time()
            try:
                self._write()
            except OSError:
                pass   # a full disk must not kill the run; the next beat tries again

    def heartbeat(self) -> None:
        """Refresh the heartbeat now (e.g. at a checkpoint)."""
        self._record["heartbeat"] = time.time()
        self._write()

    def release(self, mark: bool = True) -> None:
        """Mark the record released (other hosts need not wait for it to go stale) and unlock."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
            self._beat = None
        if self.fd is None:
            return
        if mark:
            self._record.update(released=True, heartbeat=time.time())
            try:
                self._write()
            except OSError:
                pass
        _HELD_FDS.discard(self.fd)
        os.close(self.fd)   # closing the last descriptor drops the flock
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def check_unlocked(directory: str | Path, wait: float = 0.0, log: Callable[[str], None] = print) -> None:
    """Raise :class:`RunLockError` when run ``directory`` is held (the ``--nproc`` launcher's early check)."""
    RunLock(directory, log=log).probe(wait)
