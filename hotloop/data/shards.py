"""On-disk shards: ``.npy`` arrays plus a JSON manifest of sizes and sha256s.

A prepared data directory holds ``manifest.json``::

    {"version": 1, "problem": "ptb_lm", "config": {...},
     "files": {"train.tokens.npy": {"bytes": 3718428, "sha256": "...",
                                    "dtype": "int32", "shape": [929589]}, ...},
     "meta": {...}}

``config`` fingerprints the inputs (raw checksums, vocabulary size, ...):
:func:`manifest_matches` lets datagen skip work when nothing changed.
Every file is written under a temporary name and renamed when complete, and the manifest
comes last: a datagen stopped part-way (a signal, a full disk) leaves no manifest, so no
later run trusts its files; it prepares them again.
Arrays are opened read-only with ``mmap_mode="r"``; a truncated or corrupt
file raises :class:`DataError` naming it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .download import file_digest
from .errors import ChecksumError, DataError

__all__ = ["MANIFEST", "ShardWriter", "read_manifest", "manifest_matches", "open_array", "split_fields",
           "ragged_to_arrays", "RaggedArray"]

MANIFEST = "manifest.json"
VERSION = 1


def _write_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` then rename ``tmp`` to ``path``; on any exception (a stop signal during datagen,
    a full disk) the temporary file is removed, so a file either is complete or does not exist."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ShardWriter:
    """Write arrays into ``data_dir`` (atomically, via temporary names) and finally the manifest."""

    def __init__(self, data_dir: str | Path, problem: str, config: dict[str, Any]) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / MANIFEST).unlink(missing_ok=True)  # incomplete until finish()
        self.problem, self.config = problem, config
        self.files: dict[str, dict[str, Any]] = {}

    def add_array(self, name: str, array: np.ndarray) -> None:
        path = self.data_dir / name

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as handle:
                np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        _write_atomically(path, write)
        self.files[name] = {"bytes": path.stat().st_size, "sha256": file_digest(path),
                            "dtype": str(array.dtype), "shape": list(array.shape)}

    def add_text(self, name: str, text: str) -> None:
        path = self.data_dir / name
        _write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        self.files[name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}

    def add_file(self, name: str) -> None:
        """Record a file already written into ``data_dir`` (e.g. a tokenizer model)."""
        path = self.data_dir / name
        self.files[name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}

    def finish(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        manifest = {"version": VERSION, "problem": self.problem, "config": self.config,
                    "files": self.files, "meta": meta or {}}
        text = json.dumps(manifest, indent=1, sort_keys=True)
        _write_atomically(self.data_dir / MANIFEST, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        return manifest


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Load ``manifest.json``; a missing or unreadable one raises :class:`DataError`."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: no manifest; the data is not prepared. Run "
                        "`hotloop datagen --problem P --data-dir D` (or problem.prepare()) first")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: unreadable manifest ({exc}); delete the directory and re-run datagen") from exc
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION or "files" not in manifest:
        raise DataError(f"{path}: not a hotloop manifest of version {VERSION}; re-run datagen")
    _check_entries(path, manifest)
    return manifest


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entries(path: Path, manifest: dict[str, Any]) -> None:
    """The manifest's ``files`` (plain names, sizes, sha256s, dtypes, shapes) and ``meta`` are well formed."""
    files = manifest["files"]
    if not isinstance(files, dict) or not isinstance(manifest.get("meta", {}), dict):
        raise DataError(f"{path}: its 'files' or 'meta' is not a mapping (edited or corrupt); re-run datagen")
    for name, entry in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise DataError(f"{path}: lists {name!r}, which is not a file name in the data directory; "
                            "re-run datagen")
        ok = isinstance(entry, dict) and _is_count(entry.get("bytes")) and isinstance(entry.get("sha256"), str)
        if ok and "dtype" in entry:
            ok = isinstance(entry["dtype"], str)
        if ok and "shape" in entry:
            ok = isinstance(entry["shape"], list) and all(_is_count(d) for d in entry["shape"])
        if not ok:
            raise DataError(f"{path}: the entry of {name} is not bytes/sha256/dtype/shape (edited or corrupt); "
                            "re-run datagen")


def split_fields(data_dir: str | Path, manifest: dict[str, Any], split: str) -> dict[str, tuple[str, str]]:
    """``field -> (tokens file, offsets file)`` of a prepared split (``meta.splits[split].fields``)."""
    path = Path(data_dir) / MANIFEST
    splits = manifest.get("meta", {}).get("splits", {})
    if not isinstance(splits, dict):
        raise DataError(f"{path}: its meta.splits is not a mapping; re-run datagen")
    if split not in splits:
        raise DataError(f"{Path(data_dir)}: no split {split!r} prepared (have {sorted(map(str, splits))})")
    fields = splits[split].get("fields") if isinstance(splits[split], dict) else None
    if not isinstance(fields, dict) or not all(
            isinstance(f, dict) and isinstance(f.get("tokens"), str) and isinstance(f.get("offsets"), str)
            for f in fields.values()):
        raise DataError(f"{path}: split {split!r} does not list tokens/offsets files per field; re-run datagen")
    return {name: (files["tokens"], files["offsets"]) for name, files in fields.items()}


def verify_entry(data_dir: Path, name: str, entry: dict[str, Any], *, checksum: bool = True) -> None:
    """Check one manifest entry's size (and sha256): raise :class:`DataError` naming the file."""
    path = data_dir / name
    if not path.is_file():
        raise DataError(f"{path}: listed in the manifest but missing; re-run datagen")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DataError(f"{path}: {size} bytes, the manifest says {entry['bytes']} "
                        "(truncated or overwritten); re-run datagen")
    if checksum and file_digest(path) != entry["sha256"]:
        raise ChecksumError(f"{path}: sha256 does not match the manifest (corrupt); re-run datagen")


def manifest_matches(data_dir: str | Path, problem: str, config: dict[str, Any]) -> bool:
    """True when ``data_dir`` holds a complete, verified preparation of ``config``."""
    try:
        manifest = read_manifest(data_dir)
        if manifest.get("problem") != problem or manifest.get("config") != json.loads(json.dumps(config)):
            return False
        for name, entry in manifest["files"].items():
            verify_entry(Path(data_dir), name, entry)
    except DataError:
        return False
    return True


def open_array(data_dir: str | Path, name: str, manifest: dict[str, Any], *,
               verify: bool = True) -> np.ndarray:
    """Memory-map ``data_dir/name`` read-only after checking it against the manifest."""
    data_dir = Path(data_dir)
    entry = manifest["files"].get(name)
    if entry is None:
        raise DataError(f"{data_dir / MANIFEST}: has no entry for {name}; re-run datagen")
    verify_entry(data_dir, name, entry, checksum=verify)
    path = data_dir / name
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy array ({exc}); re-run datagen") from exc
    dtype, shape = entry.get("dtype", str(array.dtype)), entry.get("shape", list(array.shape))
    if str(array.dtype) != dtype or list(array.shape) != shape:
        raise DataError(f"{path}: dtype/shape {array.dtype}{list(array.shape)} differ from the "
                        f"manifest {entry.get('dtype')}{entry.get('shape')}; re-run datagen")
    return array


def ragged_to_arrays(sequences: Iterable[Sequence[int]],
                     dtype: Any = np.int32) -> tuple[np.ndarray, np.ndarray]:
    """Pack variable-length sequences as (flat tokens, offsets of length n + 1)."""
    seqs = [np.asarray(s, dtype=dtype) for s in sequences]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=dtype)
    return flat, offsets


class RaggedArray:
    """Random access to sequence ``i`` = ``tokens[offsets[i]:offsets[i+1]]`` (no copy)."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, name: str = "") -> None:
        if offsets.ndim != 1 or len(offsets) == 0 or int(offsets[-1]) != len(tokens):
            raise DataError(f"{name or 'ragged array'}: offsets do not match the token count; re-run datagen")
        self.tokens = np.asarray(tokens)      # a plain view of the (memory-mapped) tokens
        self.offsets = np.array(offsets)      # small: kept in memory
        self._starts = self.offsets.tolist()  # python ints: fast scalar indexing

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[self._starts[index]:self._starts[index + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)
