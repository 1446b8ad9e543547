"""Reading ``torch.distributed.checkpoint`` (DCP) directories without unpickling arbitrary objects.

DCP's ``FileSystemReader`` unpickles the ``.metadata`` file with ``pickle.load`` and the
default load planner reads every non-tensor entry (an optimizer's ``lr``, ``betas``, ...)
with ``torch.load(weights_only=False)``. Both would run whatever a crafted file names.
Here:

- :class:`SafeFileSystemReader` unpickles ``.metadata`` with an unpickler that resolves only
  DCP's own metadata classes, ``torch.Size``, torch dtypes, memory formats and layouts, and
  ``pathlib`` paths; anything else raises :class:`UnsafeMetadataError`.
- :class:`SafeLoadPlanner` / :class:`SafeFullLoadPlanner` read non-tensor entries with
  ``torch.load(weights_only=True)`` (plain data only).
- Tensor data is read by DCP itself with ``torch.load(weights_only=True)``.

Callers read a directory only after its manifest verified (:func:`hotloop.train.manifest.check_dir`):
``hotloop`` reads the sharded checkpoints its own run directories list.

:func:`load_full` reads the whole (or part of the) checkpoint into one process as plain tensors
(no process group, no model needed: shapes come from the metadata), for ``eval``, ``export``
and for resuming on any world size.
"""
from __future__ import annotations

import io
import pathlib
import pickle
import warnings
from pathlib import Path
from typing import Any, Iterable

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

__all__ = ["UnsafeMetadataError", "SafeFileSystemReader", "SafeLoadPlanner", "SafeFullLoadPlanner",
           "load_full", "load_into", "READ_ERRORS"]

_METADATA = ".metadata"
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict")}


#: what a failed DCP read raises (DCP's CheckpointException is a BaseException, not an Exception)
READ_ERRORS = (Exception, CheckpointException)


class UnsafeMetadataError(pickle.UnpicklingError):
    """A ``.metadata`` file that names something other than DCP's metadata classes."""


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals a DCP ``.metadata`` file legitimately names."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _DCP_MODULES and not name.startswith("__"):
            value = super().find_class(module, name)
            if isinstance(value, type) or module.endswith(".metadata"):
                return value
        elif (module, name) in _ALLOWED:
            return getattr(pathlib, name) if module == "pathlib" else super().find_class(module, name)
        elif module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format,
                                                                            torch.layout)):
            return getattr(torch, name)
        raise UnsafeMetadataError(f"checkpoint metadata names {module}.{name}; refusing to unpickle it")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read by a restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = _METADATA if rank is None else f"__{rank}{_METADATA}"
        with open(Path(self.path) / name, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeMetadataError(f"{Path(self.path) / name} does not hold DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _plain(value: io.BytesIO) -> Any:
    return torch.load(value, weights_only=True)


class SafeLoadPlanner(DefaultLoadPlanner):
    """The default planner, with non-tensor entries read as plain data only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], _plain(value))
        else:
            self.state_dict[read_item.dest_index.fqn] = _plain(value)


class SafeFullLoadPlanner(_EmptyStateDictLoadPlanner):
    """Rebuilds the state from the metadata (no template), non-tensor entries as plain data only."""

    load_bytes = SafeLoadPlanner.load_bytes


def load_full(path: str | Path, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The checkpoint at ``path`` (only the top-level ``keys`` when given) as full plain tensors, in this
    process, with no process group: every shard is read and assembled to its global shape."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    SafeFileSystemReader(str(path)).read_metadata()   # refuse unsafe metadata before DCP reads (and logs) it
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "assuming the intent is to load in a single process"
        _load_state_dict(state, storage_reader=SafeFileSystemReader(str(path)), no_dist=True,
                         planner=SafeFullLoadPlanner(keys=set(keys) if keys is not None else None))
    return state


def load_into(path: str | Path, state: dict[str, Any], process_group: Any = None) -> None:
    """Fill the template ``state`` (its tensors, DTensors included, in place) from ``path``; a collective
    over ``process_group`` when one is given (every rank reads only the shards it holds)."""
    import torch.distributed.checkpoint as dcp
    SafeFileSystemReader(str(path)).read_metadata()
    dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner(),
             process_group=process_group, no_dist=process_group is None)
