"""Collate lists of examples into ``dict[str, Tensor]`` batches, padding with ``pad_id``."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

__all__ = ["collate", "pad_stack"]


def pad_stack(values: Sequence[Any], pad_id: int = 0) -> torch.Tensor:
    """Stack 0-d or N-d values; ragged first dimensions are right-padded with ``pad_id``.

    Integer data becomes int64, floating data keeps its dtype. Returns ``[B, L, ...]``.
    """
    arrays = [v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for v in values]
    if not arrays:
        raise ValueError("cannot collate an empty batch")
    shape = arrays[0].shape
    if all(a.shape == shape for a in arrays):  # nothing to pad
        out = np.stack(arrays)
    else:
        tail = arrays[0].shape[1:]
        if any(a.shape[1:] != tail for a in arrays):
            raise ValueError(f"cannot pad values whose trailing shapes differ: {[a.shape for a in arrays]}")
        longest = max(a.shape[0] for a in arrays)
        out = np.full((len(arrays), longest, *tail), pad_id, dtype=np.result_type(*arrays))
        for row, a in enumerate(arrays):
            out[row, :a.shape[0]] = a
    if np.issubdtype(out.dtype, np.integer) or out.dtype == np.bool_:
        out = out.astype(np.int64, copy=False)
    return torch.from_numpy(np.ascontiguousarray(out))


def collate(items: Sequence[Any], pad_id: int = 0) -> Any:
    """Dict items -> ``dict[str, Tensor]``; tuples -> tuple of Tensors; arrays -> Tensor."""
    first = items[0]
    if isinstance(first, Mapping):
        return {key: pad_stack([item[key] for item in items], pad_id) for key in first}
    if isinstance(first, tuple):
        return tuple(pad_stack([item[i] for item in items], pad_id) for i in range(len(first)))
    return pad_stack(items, pad_id)
