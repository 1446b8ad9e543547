"""Checksums, the default data directories and verified downloads.

Downloads go to a temporary name and are renamed only after the checksum
matches, so an interrupted or corrupted download never looks complete.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

from .errors import ChecksumError, DataError

__all__ = ["file_digest", "verify_file", "download", "default_data_dir", "default_raw_dir",
           "extract_members"]

_CHUNK = 1 << 20


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: str | Path, expected: str, algorithm: str = "sha256") -> None:
    """Raise :class:`ChecksumError` naming ``path`` unless its digest is ``expected``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    actual = file_digest(path, algorithm)
    if actual != expected:
        raise ChecksumError(f"{path}: {algorithm} is {actual}, expected {expected}; the file is "
                            "corrupt or a different version; delete it and download it again")


def download(url: str, dest: str | Path, *, expected: str | None = None, algorithm: str = "sha256",
             timeout: float = 60.0) -> Path:
    """Fetch ``url`` to ``dest`` (skipped when ``dest`` already matches ``expected``).

    The data is written to ``dest + '.part'`` and renamed after verification;
    a mismatch deletes the partial file and raises :class:`ChecksumError`.
    """
    dest = Path(dest)
    if dest.is_file() and expected is not None and file_digest(dest, algorithm) == expected:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(part, "wb") as out:
            shutil.copyfileobj(response, out, _CHUNK)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise DataError(f"download of {url} failed: {exc}. Without internet, download it "
                        f"elsewhere and put it at {dest} (or pass --raw-dir)") from exc
    if expected is not None:
        actual = file_digest(part, algorithm)
        if actual != expected:
            part.unlink(missing_ok=True)
            raise ChecksumError(f"{url}: downloaded file has {algorithm} {actual}, expected "
                                f"{expected}; the mirror serves a different or corrupt file")
    os.replace(part, dest)
    return dest


def extract_members(archive: str | Path, members: dict[str, str], dest_dir: str | Path) -> None:
    """Extract tar members (``{member path: output name}``) into ``dest_dir`` without
    trusting member paths (no path traversal: only the named members are written)."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member_name, out_name in members.items():
            try:
                member = tar.getmember(member_name)
            except KeyError:
                raise DataError(f"{archive}: member {member_name!r} not found") from None
            source = tar.extractfile(member)
            if source is None:
                raise DataError(f"{archive}: member {member_name!r} is not a regular file")
            with source, open(dest_dir / Path(out_name).name, "wb") as out:
                shutil.copyfileobj(source, out, _CHUNK)


def default_data_dir(problem: str) -> Path:
    """``$HOTLOOP_DATA_DIR/<problem>`` or ``~/.cache/hotloop/data/<problem>``."""
    root = os.environ.get("HOTLOOP_DATA_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "hotloop" / "data"
    return base / problem


def default_raw_dir(folder: str) -> Path:
    """``$HOTLOOP_RAW_ROOT/<folder>`` or ``~/.cache/hotloop/raw/<folder>`` (downloads land here).

    ``folder`` is the data set's folder (``ptb``, ``multi30k``); ``hotloop --raw-root DIR``
    sets ``HOTLOOP_RAW_ROOT`` for the command and its workers.
    """
    root = os.environ.get("HOTLOOP_RAW_ROOT")
    base = Path(root) if root else Path.home() / ".cache" / "hotloop" / "raw"
    return base / folder
