"""Hugging Face ``datasets.Dataset`` columns as batch tensors (dtypes kept, strings as lists).

:class:`ArrowFetch` reads a batch of rows by their indices in one call. A dataset without a
format is read as Arrow: integer, floating and bool columns become tensors of their own dtype
(an ``int32`` column stays ``int32``, ``uint8`` pixels stay ``uint8``), list columns are stacked
(or right-padded with ``pad_id`` where rows differ in length, at any nesting depth), string
columns stay lists of ``str``. A dataset with a format set by its owner (``set_format("torch")``,
``set_transform``) is read through that format and its values collated the same way.
Nothing here imports ``datasets``; it is used only when such an object is passed.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from ..errors import UserError
from .collate import as_tensor, is_text, pad_stack
from .torch_sources import BatchFormatError

__all__ = ["is_hf_dataset", "ArrowFetch", "arrow_column", "column_map", "derived_sizes"]


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a map-style ``datasets.Dataset`` (checked by class, without importing it)."""
    return any(c.__name__ == "Dataset" and c.__module__.startswith("datasets.") for c in type(obj).__mro__)


def column_map(dataset: Any, columns: Mapping[str, str] | Sequence[str] | None) -> dict[str, str]:
    """Batch key -> column name: ``columns`` as given (a list keeps the names), else every column."""
    if columns is None:
        chosen = dataset.format.get("columns") or dataset.column_names
        mapping = {name: name for name in chosen}
    elif isinstance(columns, Mapping):
        mapping = dict(columns)
    else:
        mapping = {name: name for name in columns}
    missing = sorted(set(mapping.values()) - set(dataset.column_names))
    if missing:
        raise UserError(f"data: the dataset has no column {missing[0]!r} (columns: {', '.join(dataset.column_names)})")
    return mapping


def _numeric(arr: Any, name: str) -> torch.Tensor:
    values = arr.to_numpy(zero_copy_only=False)
    if not values.flags.writeable:
        values = values.copy()
    return torch.from_numpy(values)


def arrow_column(arr: Any, name: str, pad_id: int = 0) -> torch.Tensor | list[Any]:
    """One Arrow column of a batch as a tensor ``[B, ...]`` of its dtype, or a list (strings)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise BatchFormatError(f"data: column {name!r} has missing values; fill them or drop the rows first")
    kind = arr.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind):
        return arr.to_pylist()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        inner = arrow_column(arr.flatten(), name, pad_id)               # [sum(lengths), ...]
        if isinstance(inner, list):
            return arr.to_pylist()
        if len(lengths) and bool((lengths == lengths[0]).all()):
            return inner.reshape(len(lengths), int(lengths[0]), *inner.shape[1:])   # [B, L, ...]
        rows = torch.split(inner, lengths.tolist())
        padding = bool(pad_id) if inner.dtype == torch.bool else pad_id
        return pad_sequence(list(rows), batch_first=True, padding_value=padding)   # [B, L_max, ...]
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return _numeric(arr, name)
    raise BatchFormatError(f"data: column {name!r} is of type {kind}, which does not make a tensor; convert it "
                    "with dataset.map(...) or drop it (remove_columns)")


def _formatted(value: Any, name: str, pad_id: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype != object:
        return as_tensor(value)
    values = list(value)
    if not values or is_text(values[0]):
        return values
    try:
        return pad_stack(values, pad_id, keep_dtypes=True)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise BatchFormatError(f"data: column {name!r} does not make a tensor: {exc}") from None


class ArrowFetch:
    """``indices -> batch``: rows of an HF dataset, one key per mapped column (picklable)."""

    def __init__(self, dataset: Any, columns: Mapping[str, str] | Sequence[str] | None = None,
                 pad_id: int = 0) -> None:
        self.columns = column_map(dataset, columns)
        self.formatted = dataset.format.get("type") is not None
        self.dataset = dataset if self.formatted else dataset.with_format("arrow")
        self.pad_id = pad_id

    def __call__(self, indices: list[int]) -> dict[str, Any]:
        rows = self.dataset[list(indices)]
        if self.formatted:
            batch = {key: _formatted(rows[col], col, self.pad_id) for key, col in self.columns.items()}
        else:
            batch = {key: arrow_column(rows.column(col), col, self.pad_id) for key, col in self.columns.items()}
        return batch


_SIZES = {"inputs": ("input_vocab_size", "max_input_length"), "targets": ("target_vocab_size", "max_target_length")}


def derived_sizes(dataset: Any, columns: Mapping[str, str] | Sequence[str] | None = None) -> dict[str, int]:
    """Vocabulary sizes (largest id + 1) and longest rows of the ``inputs`` / ``targets`` integer
    columns of an HF dataset, by name of the :class:`~hotloop.problems.base.ProblemSpec` field."""
    import pyarrow as pa
    import pyarrow.compute as pc
    mapping = column_map(dataset, columns)
    table = dataset.with_format("arrow")[:]
    sizes: dict[str, int] = {}
    for key, (vocab_field, length_field) in _SIZES.items():
        if key not in mapping:
            continue
        arr = table.column(mapping[key]).combine_chunks()
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            lengths = pc.list_value_length(arr)
            sizes[length_field] = int(pc.max(lengths).as_py() or 0)
            arr = arr.flatten()
        if pa.types.is_integer(arr.type) and len(arr):
            sizes[vocab_field] = int(pc.max(arr).as_py()) + 1
    return sizes
