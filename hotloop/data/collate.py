"""Collate lists of examples into ``dict[str, Tensor]`` batches, padding with ``pad_id``.

Collation is done in torch: a tensor is stacked as it is, a numpy array becomes a tensor
without a copy of its values into another array first, numbers and lists go through
``torch.as_tensor``. Two dtype rules:

- ``keep_dtypes=True`` (data brought by a user, :func:`hotloop.problems.datasets.problem_from_data`):
  every value keeps its dtype (uint8 images stay uint8, int32 stays int32, bool stays bool);
  Python ints become int64 and Python floats ``torch.get_default_dtype()``.
- ``keep_dtypes=False`` (the built-in problems' token batches): integer and bool data become
  int64, floating data keeps its dtype.

Strings (``str`` / ``bytes`` values) are not tensors: a field of strings stays a list.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

__all__ = ["collate", "pad_stack", "as_tensor", "is_text"]


def is_text(value: Any) -> bool:
    """Whether ``value`` is a string (a value collation keeps as a Python object)."""
    return isinstance(value, (str, bytes))


def as_tensor(value: Any) -> torch.Tensor:
    """``value`` as a tensor of its own dtype (numpy arrays shared, not copied)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise ValueError("cannot collate a numpy object array (ragged rows inside one example?)")
        return torch.from_numpy(value) if value.flags.writeable else torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return torch.from_numpy(np.asarray(value))
    return torch.as_tensor(value)


def pad_stack(values: Sequence[Any], pad_id: int = 0, *, keep_dtypes: bool = False) -> torch.Tensor:
    """Stack 0-d or N-d values; ragged first dimensions are right-padded with ``pad_id``.

    Returns ``[B, L, ...]``; dtypes follow the module's rules (``keep_dtypes``).
    """
    if not values:
        raise ValueError("cannot collate an empty batch")
    tensors = [as_tensor(v) for v in values]
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        dtype = _promote([t.dtype for t in tensors])
        tensors = [t.to(dtype) for t in tensors]
    shape = tensors[0].shape
    if all(t.shape == shape for t in tensors):       # nothing to pad
        out = torch.stack(tensors)                   # [B, *shape]
    else:
        if any(t.dim() == 0 for t in tensors) or any(t.shape[1:] != shape[1:] for t in tensors):
            raise ValueError(f"cannot pad values whose trailing shapes differ: {[tuple(t.shape) for t in tensors]}")
        padding = pad_id if dtype != torch.bool else bool(pad_id)
        out = pad_sequence(tensors, batch_first=True, padding_value=padding)   # [B, L_max, ...]
    if not keep_dtypes and (not out.dtype.is_floating_point and not out.dtype.is_complex):
        out = out.to(torch.int64)
    return out.contiguous()


def _promote(dtypes: list[torch.dtype]) -> torch.dtype:
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return result


def _field(values: Sequence[Any], pad_id: int, keep_dtypes: bool) -> Any:
    if is_text(values[0]):
        return list(values)
    if isinstance(values[0], Mapping):
        return collate(values, pad_id, keep_dtypes=keep_dtypes)
    return pad_stack(values, pad_id, keep_dtypes=keep_dtypes)


def collate(items: Sequence[Any], pad_id: int = 0, *, keep_dtypes: bool = False) -> Any:
    """Dict items -> ``dict[str, Tensor]``; tuples -> tuple of Tensors; arrays -> Tensor.

    A field of strings stays a list of strings; nested dicts are collated field by field.
    """
    first = items[0]
    if isinstance(first, Mapping):
        return {key: _field([item[key] for item in items], pad_id, keep_dtypes) for key in first}
    if isinstance(first, tuple):
        return tuple(_field([item[i] for item in items], pad_id, keep_dtypes) for i in range(len(first)))
    return _field(items, pad_id, keep_dtypes)
