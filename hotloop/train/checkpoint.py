"""Checkpoint files: atomic writes, safe loads, keep-last-K plus the best.

A checkpoint is ONE file written with ``torch.save`` that holds only tensors
and plain data (dicts, lists, numbers, strings); everything non-tensor that
describes the run lives in a JSON string (``meta``). Loading uses
``torch.load(weights_only=True)``, which never unpickles arbitrary objects.

Writes are atomic: a temporary file in the same directory is written,
flushed and fsynced, then renamed over the final name and the directory is
fsynced; a process killed mid-write leaves the previous checkpoints intact.

Checkpoints prove themselves: :class:`CheckpointManager` writes each one's size
and sha256 into a manifest after its data (:mod:`hotloop.train.manifest`), and
:func:`load_checkpoint` checks it first. A damaged file raises
:class:`CorruptCheckpointError`; :meth:`CheckpointManager.newest_verified` moves
damaged files aside (``step-N.ckpt.corrupt``) and returns the newest that verifies.

A run with more than one process writes sharded checkpoints instead, directories
``step-N.dcp`` (:mod:`hotloop.train.dcp_checkpoint`, :meth:`CheckpointManager.save_sharded`);
:func:`load_checkpoint` and :func:`verify_checkpoint` read both kinds, and the manager lists,
keeps, prunes and sets aside both alike.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..errors import UserError
from .manifest import check_file, manifest_path, move_aside, write_manifest

__all__ = ["CheckpointError", "CorruptCheckpointError", "CheckpointManager", "save_checkpoint",
           "load_checkpoint", "verify_checkpoint", "encode_plain", "decode_plain", "write_failure",
           "FORMAT", "FORMAT_VERSION"]

Notify = Callable[[str], None]

FORMAT = "hotloop-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d{8,})\.(ckpt|dcp)$")
_PAUSE_ENV = "HOTLOOP_TEST_CHECKPOINT_PAUSE"  # "STEP:SECONDS": sleep before the rename (tests)


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, corrupt, unsafe or incompatible; names the file."""


class CorruptCheckpointError(CheckpointError):
    """A damaged checkpoint: it fails its manifest, its zip CRCs, or cannot be read; ``reason`` says how."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is damaged: {reason}")
        self.path, self.reason = path, reason


def _stderr_notice(message: str) -> None:
    print(f"hotloop: {message}", file=sys.stderr)


def verify_checkpoint(path: str | Path) -> bool:
    """Check ``path`` against its manifest: True when verified, False when it has none (zip CRCs checked).

    Raises :class:`CorruptCheckpointError` for a damaged file, :class:`CheckpointError` for a missing one.
    """
    path = Path(path)
    if path.name.endswith(".dcp"):
        from .dcp_checkpoint import verify_sharded
        verify_sharded(path)
        return True
    try:
        has_manifest, reason = check_file(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    if reason is not None:
        raise CorruptCheckpointError(path, reason)
    return has_manifest


def encode_plain(obj: Any) -> Any:
    """Make reader/RNG state loadable with ``weights_only=True`` (numpy -> tensors)."""
    if isinstance(obj, np.ndarray):  # stored as raw bytes: any numeric dtype round-trips exactly
        flat = np.ascontiguousarray(obj).reshape(-1)
        return {"__ndarray__": torch.from_numpy(flat.view(np.uint8).copy()),
                "dtype": flat.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode_plain(v) for v in obj)
    return obj


def decode_plain(obj: Any) -> Any:
    """Inverse of :func:`encode_plain`."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            raw = obj["__ndarray__"].numpy().copy()
            return raw.view(np.dtype(obj["dtype"])).reshape(obj["shape"])
        return {k: decode_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode_plain(v) for v in obj)
    return obj


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _test_pause(step: int) -> None:
    spec = os.environ.get(_PAUSE_ENV, "")
    if spec:
        at, _, seconds = spec.partition(":")
        if int(at) == step:
            time.sleep(float(seconds or 60))


#: what torch's zip writer says when a write comes up short (a full disk or quota)
_SHORT_WRITE = ("unexpected pos", "file write failed", "no space left")


def write_failure(exc: BaseException, path: Path) -> CheckpointError | None:
    """A one-line :class:`CheckpointError` for a write that failed for lack of space, else None.

    Covers ``OSError(ENOSPC)``/``EDQUOT`` and torch's ``RuntimeError: [enforce fail at
    inline_container.cc:...] unexpected pos ...`` wrapping of the same failure.
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return CheckpointError(f"cannot write {path}: no space left on device")
    text = str(exc).lower()
    if isinstance(exc, RuntimeError) and any(marker in text for marker in _SHORT_WRITE):
        return CheckpointError(f"cannot write {path}: no space left on device (the write came up short)")
    return None


def save_checkpoint(path: str | Path, meta: dict[str, Any], tensors: dict[str, Any]) -> Path:
    """Atomically write ``meta`` (JSON-serialisable) and ``tensors`` (tensors/plain data) to ``path``."""
    path = Path(path)
    payload = {"format": FORMAT, "version": FORMAT_VERSION,
               "meta": json.dumps(meta, sort_keys=True), **tensors}
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        _test_pause(int(meta.get("step", -1)))
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        failure = write_failure(exc, path)
        if failure is not None:
            raise failure from None
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", *, verify: bool = True,
                    notify: Notify | None = None) -> dict[str, Any]:
    """Load a checkpoint safely; returns the payload with ``meta`` decoded to a dict.

    Raises :class:`CheckpointError` (naming the file) for a missing, unsafe (non
    tensor/plain data), foreign or newer-format file, and :class:`CorruptCheckpointError`
    for a damaged one: with ``verify`` its manifest is checked first; a checkpoint
    without one (written before manifests existed) loads after one ``notify`` line
    (default: stderr). A sharded checkpoint (a ``.dcp`` directory) loads into this one process
    with full tensors (:func:`hotloop.train.dcp_checkpoint.read_sharded`).
    """
    path = Path(path)
    if path.name.endswith(".dcp") and path.is_dir():
        from .dcp_checkpoint import read_sharded
        return read_sharded(path, verify=verify)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if verify and not verify_checkpoint(path):
        (notify or _stderr_notice)(f"checkpoint {path} has no manifest (written before hotloop recorded "
                                   f"checksums); loading it with only its zip CRCs checked")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "not a valid checkpoint"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            reason = "it contains objects other than tensors and plain data; refusing to unpickle them"
            raise CheckpointError(f"cannot load checkpoint {path}: {reason}") from None
        raise CorruptCheckpointError(path, f"torch.load failed: {reason[:200]}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CorruptCheckpointError(path, "it is not a hotloop checkpoint")
    if payload.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {payload.get('version')}, "
                              f"this hotloop reads version {FORMAT_VERSION}")
    try:
        payload["meta"] = json.loads(payload["meta"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(path, f"its metadata is unreadable: {exc}") from None
    if not isinstance(payload["meta"], dict):
        raise CorruptCheckpointError(path, f"its metadata is a {type(payload['meta']).__name__}, not a mapping")
    return payload


class CheckpointManager:
    """``directory/step-XXXXXXXX.ckpt`` files (``.dcp`` directories for sharded checkpoints): keeps the
    newest ``keep_last`` plus the best.

    The best (lowest validation loss) is recorded in ``best.json``. Each file has a
    manifest (``step-XXXXXXXX.manifest.json``; a directory keeps its own inside). Only a ``writer``
    moves damaged files aside; the other ranks of a job skip them (they reach the same verdict
    from the same bytes).
    """

    def __init__(self, directory: str | Path, keep_last: int = 3, *, writer: bool = True) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.writer = writer
        self.best_step: int | None = None
        self.best_loss = float("inf")
        self._saver: Any = None
        self._after_save: tuple[int, Path, float | None, dict[str, Any] | None] | None = None
        best = self.directory / "best.json"
        if best.is_file():
            try:
                info = json.loads(best.read_text())
                self.best_step, self.best_loss = int(info["step"]), float(info["valid_loss"])
            except (ValueError, KeyError, TypeError):
                pass

    def path_for(self, step: int) -> Path:
        """The checkpoint of ``step``: its ``.dcp`` directory when there is one, else its file."""
        sharded = self.directory / f"step-{step:08d}.dcp"
        return sharded if sharded.is_dir() else self.directory / f"step-{step:08d}.ckpt"

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending (temporary files and directories are ignored)."""
        if not self.directory.is_dir():
            return []
        found = (_NAME.match(p.name) for p in self.directory.iterdir())
        return sorted({int(m.group(1)) for m in found if m})

    def latest(self) -> Path | None:
        steps = self.steps()
        return self.path_for(steps[-1]) if steps else None

    def best(self) -> Path | None:
        if self.best_step is not None and self.path_for(self.best_step).exists():
            return self.path_for(self.best_step)
        return None

    def save(self, step: int, meta: dict[str, Any], tensors: dict[str, Any],
             valid_loss: float | None = None, best_info: dict[str, Any] | None = None) -> Path:
        """Write the checkpoint for ``step``, update the best record, prune old files.

        ``valid_loss`` is the score the best is chosen by (lower is better: the Trainer passes its
        monitored metric, negated for ``mode=max``); ``best_info`` is added to ``best.json``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        manifest_path(self.directory / f"step-{step:08d}.ckpt").unlink(missing_ok=True)   # old bytes
        path = save_checkpoint(self.directory / f"step-{step:08d}.ckpt", meta, tensors)
        try:
            write_manifest(path, step=step, epoch=meta.get("epoch"))
        except OSError as exc:
            raise (write_failure(exc, manifest_path(path)) or exc) from None
        self._record_best(step, path, valid_loss, best_info)
        self.prune()
        return path

    def save_sharded(self, step: int, parts: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
                     components: Any, *, rank: int, world_size: int, valid_loss: float | None = None,
                     best_info: dict[str, Any] | None = None, asynchronous: bool = False) -> Path:
        """Every rank: write the sharded checkpoint ``step-XXXXXXXX.dcp`` (see
        :mod:`hotloop.train.dcp_checkpoint`); ``parts`` is ``(meta, main, own)`` from
        :func:`hotloop.train.snapshot.sharded_contents`. With ``asynchronous`` it returns while the
        write goes on; :meth:`wait` completes it (the next save waits too)."""
        from .dcp_checkpoint import ShardedSaver
        self.wait()
        if self._saver is None:
            self._saver = ShardedSaver(self.directory, rank, world_size)
        if self.writer:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_stale_temporaries()
        meta, main, own = parts
        path = self._saver.save(step, meta, main, own, components, asynchronous=asynchronous)
        self._after_save = (step, path, valid_loss, best_info)
        if not asynchronous:
            self._finish_save()
        return path

    def wait(self) -> None:
        """Complete an asynchronous sharded save in flight (every rank calls it; a no-op without one)."""
        if self._saver is not None:
            try:
                self._saver.wait()
            except BaseException:
                self._after_save = None
                raise
        self._finish_save()

    def _finish_save(self) -> None:
        if self._after_save is None:
            return
        (step, path, valid_loss, best_info), self._after_save = self._after_save, None
        if self.writer:
            self._record_best(step, path, valid_loss, best_info)
            self.prune()

    def _record_best(self, step: int, path: Path, valid_loss: float | None,
                     best_info: dict[str, Any] | None = None) -> None:
        if valid_loss is not None and valid_loss < self.best_loss:
            self.best_step, self.best_loss = step, float(valid_loss)
            tmp = self.directory / f".tmp-best.json-{os.getpid()}"
            try:
                tmp.write_text(json.dumps({"step": step, "file": path.name, "valid_loss": valid_loss,
                                           **(best_info or {})}))
                os.replace(tmp, self.directory / "best.json")
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise (write_failure(exc, self.directory / "best.json") or exc) from None

    def prune(self) -> None:
        steps = self.steps()
        keep = set(steps[-self.keep_last:])
        if self.best_step is not None:
            keep.add(self.best_step)
        for step in steps:
            if step not in keep:
                path = self.path_for(step)
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                path.unlink(missing_ok=True)
                manifest_path(path).unlink(missing_ok=True)

    def set_aside(self, error: CorruptCheckpointError, notify: Notify, then: str = "") -> None:
        """Move a damaged checkpoint aside (writer only; never deleted) and say so in one line."""
        if self.writer:
            try:
                moved = f"moved it aside to {move_aside(error.path).name}"
            except FileNotFoundError:
                moved = "another process moved it already"
            notify(f"checkpoint {error.path} is damaged ({error.reason}); {moved}{then}")

    def newest_verified(self, notify: Notify = _stderr_notice) -> Path | None:
        """The newest checkpoint that verifies; each damaged newer one is set aside with a notice."""
        for step in reversed(self.steps()):
            path = self.path_for(step)
            try:
                verify_checkpoint(path)
            except CorruptCheckpointError as exc:
                self.set_aside(exc, notify)
                continue
            except CheckpointError:   # gone meanwhile (pruned, or set aside by another process)
                continue
            return path
        return None

    def verified(self, which: str = "best", notify: Notify = _stderr_notice) -> Path | None:
        """The best (``which="best"``, else the newest) checkpoint that verifies; a damaged best is
        set aside with a notice and the newest that verifies is used instead."""
        best = self.best() if which == "best" else None
        if best is not None:
            try:
                verify_checkpoint(best)
                return best
            except CorruptCheckpointError as exc:
                self.set_aside(exc, notify, "; using the newest checkpoint that verifies instead")
        return self.newest_verified(notify)

    def _remove_stale_temporaries(self) -> None:
        for p in self.directory.glob(".tmp-*"):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)   # a sharded save that never completed
            else:
                p.unlink(missing_ok=True)
