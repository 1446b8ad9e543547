"""Checkpoint manifests: each checkpoint's size and sha256, written after its data.

``step-00000060.ckpt`` gets ``step-00000060.manifest.json`` (format, file name,
size, sha256, step, epoch). The manifest is written after the checkpoint's data
is renamed into place, atomically (a temporary file, fsync, ``os.replace``), and
removed before a checkpoint of the same name is rewritten, so a manifest never
describes other bytes than its file's. A crash between the two leaves a complete
checkpoint without a manifest, which loads like a checkpoint from before
manifests existed: its zip CRCs are checked instead (torch writes every entry with
a CRC32), which finds a truncated file or a flipped byte in the tensor data.

A sharded checkpoint (a directory ``step-00000060.dcp``, :mod:`hotloop.train.dcp_checkpoint`)
keeps its manifest inside, as ``manifest.json``: the size and sha256 of every file in the
directory, written before the directory is renamed into place (:func:`write_dir_manifest`,
:func:`check_dir`); a file the manifest does not list makes the directory damaged.

This module reports damage as reason strings; :mod:`hotloop.train.checkpoint`
turns them into errors. A damaged checkpoint is moved aside (renamed to
``<name>.corrupt``, never deleted) by :func:`move_aside`.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "DIR_MANIFEST", "manifest_path", "file_digest",
           "write_manifest", "read_manifest", "check_file", "write_dir_manifest", "read_dir_manifest",
           "check_dir", "move_aside"]

MANIFEST_FORMAT = "hotloop-checkpoint-manifest"
MANIFEST_VERSION = 1
DIR_MANIFEST = "manifest.json"   # inside a sharded checkpoint's directory
_CHUNK = 1 << 20
#: (path, size, mtime_ns, inode, manifest mtime_ns) of files that verified in this process
_VERIFIED: dict[tuple[Any, ...], bool] = {}


def manifest_path(checkpoint: str | Path) -> Path:
    """``step-N.ckpt`` -> ``step-N.manifest.json`` (next to it)."""
    checkpoint = Path(checkpoint)
    stem = checkpoint.name[:-len(".ckpt")] if checkpoint.name.endswith(".ckpt") else checkpoint.name
    return checkpoint.with_name(f"{stem}.manifest.json")


def file_digest(path: str | Path) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of ``path``."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def _write_record(target: Path, record: dict[str, Any]) -> Path:
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_manifest(checkpoint: str | Path, **fields: Any) -> Path:
    """Digest ``checkpoint`` and write its manifest atomically; ``fields`` (step, epoch) are recorded too."""
    checkpoint = Path(checkpoint)
    size, sha256 = file_digest(checkpoint)
    record = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "file": checkpoint.name,
              "size": size, "sha256": sha256, **fields}
    return _write_record(manifest_path(checkpoint), record)


def write_dir_manifest(directory: str | Path, **fields: Any) -> Path:
    """Digest every file of ``directory`` into ``directory/manifest.json``; ``fields`` are recorded too."""
    directory = Path(directory)
    files = {}
    for path in sorted(directory.iterdir()):
        if path.name != DIR_MANIFEST and path.is_file():
            size, sha256 = file_digest(path)
            files[path.name] = {"size": size, "sha256": sha256}
    record = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "kind": "sharded",
              "files": files, **fields}
    return _write_record(directory / DIR_MANIFEST, record)


def read_dir_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest inside a sharded checkpoint; raises ValueError when it is missing or unreadable."""
    path = Path(directory) / DIR_MANIFEST
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"it has no {DIR_MANIFEST} (the save did not complete)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"its {DIR_MANIFEST} is unreadable ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != MANIFEST_FORMAT \
            or record.get("kind") != "sharded" or not isinstance(record.get("files"), dict):
        raise ValueError(f"its {DIR_MANIFEST} is not a hotloop sharded-checkpoint manifest")
    return record


def _dir_key(directory: Path) -> tuple[Any, ...]:
    stats = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino)
                  for p in sorted(directory.iterdir()))
    return str(directory.resolve()), stats


def check_dir(directory: str | Path) -> str | None:
    """Why the sharded checkpoint ``directory`` is damaged (or incomplete), or None when every file
    matches its manifest and no file is unlisted. Raises FileNotFoundError when it does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(directory)
    key = _dir_key(directory)
    if key in _VERIFIED:
        return None
    try:
        record = read_dir_manifest(directory)
    except ValueError as exc:
        return str(exc)
    present = {p.name for p in directory.iterdir()} - {DIR_MANIFEST}
    unlisted = sorted(present - set(record["files"]))
    if unlisted:
        return f"it holds files its manifest does not list: {', '.join(unlisted[:3])}"
    for name, entry in record["files"].items():
        path = directory / name
        if not path.is_file():
            return f"its file {name} is missing"
        size, sha256 = file_digest(path)
        if size != entry.get("size"):
            return f"its file {name} is {size} bytes, its manifest says {entry.get('size')}"
        if sha256 != entry.get("sha256"):
            return f"the sha256 of its file {name} does not match its manifest"
    _VERIFIED[key] = True
    return None


def read_manifest(checkpoint: str | Path) -> dict[str, Any] | None:
    """The manifest of ``checkpoint``; None when it has none. Raises ValueError when it is unreadable."""
    path = manifest_path(checkpoint)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"its manifest {path.name} cannot be read ({exc.strerror or exc})") from None
    try:
        record = json.loads(text)
    except ValueError:
        raise ValueError(f"its manifest {path.name} is not valid JSON") from None
    if not isinstance(record, dict) or record.get("format") != MANIFEST_FORMAT \
            or not isinstance(record.get("size"), int) or not isinstance(record.get("sha256"), str):
        raise ValueError(f"its manifest {path.name} is not a hotloop checkpoint manifest")
    return record


def _cache_key(path: Path) -> tuple[Any, ...]:
    st = path.stat()
    try:
        manifest_mtime = manifest_path(path).stat().st_mtime_ns
    except OSError:
        manifest_mtime = -1
    return str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, manifest_mtime


def _zip_damage(path: Path) -> str | None:
    """Why ``path`` is not an intact zip archive (torch's checkpoint format), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"it is not a complete zip archive ({exc})"
    return f"the CRC of its entry {bad} does not match" if bad else None


def check_file(path: str | Path) -> tuple[bool, str | None]:
    """``(has a manifest, reason it is damaged or None)`` for the checkpoint file ``path``.

    With a manifest: size and sha256 must match. Without one: the zip CRCs must.
    Raises FileNotFoundError when ``path`` does not exist.
    """
    path = Path(path)
    key = _cache_key(path)
    if key in _VERIFIED:
        return _VERIFIED[key], None
    try:
        record = read_manifest(path)
    except ValueError as exc:
        return True, str(exc)
    if record is None:
        reason = _zip_damage(path)
    else:
        size, sha256 = file_digest(path)
        if size != record["size"]:
            reason = f"it is {size} bytes, its manifest says {record['size']}"
        elif sha256 != record["sha256"]:
            reason = "its sha256 does not match its manifest"
        else:
            reason = None
    if reason is None:
        _VERIFIED[key] = record is not None
    return record is not None, reason


def _free_name(path: Path) -> Path:
    candidate = path.with_name(f"{path.name}.corrupt")
    index = 1
    while candidate.exists() or manifest_path(candidate).exists():
        candidate = path.with_name(f"{path.name}.corrupt.{index}")
        index += 1
    return candidate


def move_aside(path: str | Path) -> Path:
    """Rename a damaged checkpoint (and its manifest) to ``<name>.corrupt`` (``.corrupt.1``, ...); never delete."""
    path = Path(path)
    target = _free_name(path)
    os.rename(path, target)
    manifest = manifest_path(path)
    if manifest.exists():
        os.rename(manifest, manifest_path(target))
    return target
