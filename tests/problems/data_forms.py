"""Shared pieces of the data-form tests: a counting dataset, a stream, a probe model, the forms."""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hotloop.models.base import LossOutput, count

SIZE, BATCH = 24, 4
FEATURES = (np.arange(SIZE * 4, dtype=np.int64).reshape(SIZE, 4) * 37 % 251).astype(np.uint8)   # [24, 4]


def item(i: int) -> dict[str, Any]:
    return {"inputs": torch.from_numpy(FEATURES[i]), "targets": torch.tensor(i % 3), "index": torch.tensor(i)}


class Items(Dataset):
    """Item ``i``: uint8 features, a label, its index; counts reads (``reads``)."""

    def __init__(self, size: int = SIZE) -> None:
        self.size, self.reads = size, 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.reads += 1
        return item(i)


class WhereRead(Items):
    """Items that say which process and thread read them."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        out = super().__getitem__(i)
        out["pid"], out["thread"] = torch.tensor(os.getpid()), torch.tensor(threading.get_ident())
        return out


class Stream(IterableDataset):
    """The same items as a stream (the same order every pass); counts reads."""

    def __init__(self, size: int = SIZE) -> None:
        self.size, self.reads = size, 0

    def __iter__(self):
        for i in range(self.size):
            self.reads += 1
            yield item(i)


class Probe(nn.Module):
    """A linear classifier of the uint8 features; records the item indices it trains on."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        self.seen: list[list[int]] = []
        self.dtypes: dict[str, torch.dtype] = {}

    def loss(self, batch: dict[str, Any], state: Any = None, with_accuracy: bool = False) -> LossOutput:
        x = batch["inputs"]                                     # [B, 4] uint8
        self.dtypes = {k: v.dtype for k, v in batch.items() if isinstance(v, torch.Tensor)}
        if self.training:
            self.seen.append(batch["index"].tolist())
        y = batch["targets"].reshape(-1)                        # [B]
        logits = self.lin(x.float() / 255.0)                    # [B, 3]
        nll = F.cross_entropy(logits, y, reduction="sum")
        n = count(y.numel(), y)
        return LossOutput(nll / y.numel(), {"nll_sum": nll.detach(), "tokens": n, "examples": n}, weight=n)


def hf_dataset() -> Any:
    import datasets
    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict({"inputs": FEATURES, "targets": np.arange(SIZE) % 3,
                                       "index": np.arange(SIZE)})


def make(form: str) -> Any:
    """The 24 items in ``form`` (batches of 4 where the form has its own batch size)."""
    if form == "dataset":
        return Items()
    if form == "list":
        return [item(i) for i in range(SIZE)]
    if form == "hf":
        return hf_dataset()
    if form == "loader":
        return DataLoader(Items(), batch_size=BATCH, shuffle=True)
    if form == "loader_workers":
        return DataLoader(Items(), batch_size=BATCH, shuffle=True, num_workers=2)
    if form == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(Items(), batch_size=BATCH, shuffle=True)
    if form == "iterable":
        return Stream()
    if form == "loader_iterable":
        return DataLoader(Stream(), batch_size=BATCH)
    if form == "function":
        items = [item(i) for i in range(SIZE)]
        return lambda: iter(items)
    raise ValueError(form)


def reads(data: Any) -> int:
    """Items read so far from ``data`` (a dataset or a loader over one)."""
    return getattr(data, "dataset", data).reads
