"""Datagen helpers: run a problem's ``prepare()``; write ragged splits into shards."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .shards import ShardWriter, ragged_to_arrays

__all__ = ["prepare", "write_ragged_split"]


def prepare(problem: Any, data_dir: str | Path | None = None, raw_dir: str | Path | None = None) -> Any:
    """Make a problem's data ready (idempotent); ``problem`` is an instance or a registered name.

    This is what ``hotloop datagen --problem P --data-dir D`` runs. Returns what
    ``prepare()`` returns (the data directory for file-backed problems).
    """
    if isinstance(problem, str):
        from ..registry import problems
        problem = problems.get(problem)(data_dir=data_dir, raw_dir=raw_dir)
    return problem.prepare()


def write_ragged_split(writer: ShardWriter, split: str,
                       fields: dict[str, Sequence[Sequence[int]]]) -> dict[str, Any]:
    """Write each field as ``<split>.<field>.tokens.npy`` + ``.offsets.npy``; return the split's meta."""
    meta: dict[str, Any] = {"fields": {}}
    sizes = {len(v) for v in fields.values()}
    if len(sizes) != 1:
        raise ValueError(f"split {split!r}: fields differ in length {sorted(sizes)}")
    for field, sequences in fields.items():
        tokens, offsets = ragged_to_arrays(sequences)
        names = {"tokens": f"{split}.{field}.tokens.npy", "offsets": f"{split}.{field}.offsets.npy"}
        writer.add_array(names["tokens"], tokens)
        writer.add_array(names["offsets"], offsets)
        meta["fields"][field] = names
        meta.setdefault("tokens", {})[field] = int(len(tokens))
        meta.setdefault("max_length", {})[field] = int((offsets[1:] - offsets[:-1]).max(initial=0))
    meta["examples"] = sizes.pop()
    return meta
