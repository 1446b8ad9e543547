"""Your own ``nn.Module`` on your own ``torch.utils.data.DataLoader``, as a script or through ``hotloop``.

    python examples/train_dataloader.py [--max-steps 200] [--output-dir runs/bars]
    hotloop train --import examples/train_dataloader.py --problem bars_loader --model bars_net \\
        --hparams bars_small --output-dir runs/bars --max-steps 200

The data stands in for an image dataset: 8x8 uint8 pictures of a horizontal or a vertical bar
on noise, in a ``TensorDataset`` read by ``DataLoader``s (shuffled train loader, a ``collate_fn``
of its own that makes dict batches). The pictures reach the model as uint8 and the model casts
them. ``bars_loader`` (a function returning :func:`~hotloop.problems.datasets.problem_from_data`),
``bars_net`` and ``bars_small`` register themselves for ``--import``. The model's ``loss`` method
returns the statistics (``nll_sum``, ``tokens``, ``examples``, ``correct``) from which the
Trainer reports loss and accuracy.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hotloop.engine import Strategy
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput, token_stats
from hotloop.problems.base import ProblemSpec
from hotloop.problems.datasets import DataProblem, problem_from_data
from hotloop.registry import hparams_sets, models, problems
from hotloop.train import Trainer

SIDE = 8


def make_bars(count: int, seed: int) -> TensorDataset:
    """``count`` uint8 pictures ``[1, 8, 8]`` with a bar (label 0: horizontal, 1: vertical)."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 96, (count, 1, SIDE, SIDE), generator=gen, dtype=torch.uint8)   # noise
    labels = torch.randint(0, 2, (count,), generator=gen)
    where = torch.randint(0, SIDE, (count,), generator=gen)
    for i in range(count):
        if labels[i] == 0:
            images[i, 0, where[i], :] = 255
        else:
            images[i, 0, :, where[i]] = 255
    return TensorDataset(images, labels)


def to_dict(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A ``collate_fn`` of your own: the loader's batches are dicts (hotloop keeps what it returns)."""
    images, labels = zip(*items)
    return {"inputs": torch.stack(images), "targets": torch.stack(labels)}     # uint8 [B, 1, 8, 8], [B]


def loaders(batch_size: int = 32) -> tuple[DataLoader, DataLoader]:
    train = DataLoader(make_bars(2048, seed=0), batch_size=batch_size, shuffle=True, collate_fn=to_dict)
    valid = DataLoader(make_bars(512, seed=1), batch_size=128, collate_fn=to_dict)
    return train, valid


@problems.register("bars_loader")
def bars_loader(data_dir: Any = None, raw_dir: Any = None) -> DataProblem:
    """The problem ``--problem bars_loader`` names: the two loaders, no vocabulary sizes needed."""
    train, valid = loaders()
    return problem_from_data(train=train, valid=valid)


@models.register("bars_net")
class BarsNet(nn.Module):
    """A small conv net: uint8 ``[B, 1, 8, 8]`` -> 2 logits."""

    tasks = ("custom",)

    def __init__(self, hp: HParams | None = None, spec: ProblemSpec | None = None) -> None:
        super().__init__()
        width = hp.hidden_size if hp is not None else 32
        self.net = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1),
                                 nn.Flatten(), nn.Linear(width, 2))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.float() / 255.0)                     # [B, 2]

    def loss(self, batch: dict[str, torch.Tensor], state: Any = None, with_accuracy: bool = False) -> LossOutput:
        logits = self(batch["inputs"])[:, None, :]                  # [B, 1, 2]: one "token" per picture
        targets = batch["targets"][:, None]                         # [B, 1]
        loss, stats = token_stats(logits, targets, with_accuracy=with_accuracy, pad_id=-1)   # no padding
        return LossOutput(loss, stats, weight=stats["tokens"])


@hparams_sets.register("bars_small")
def bars_small() -> HParams:
    return HParams(hidden_size=32, learning_rate=3e-3, optimizer="adam", max_steps=200)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--output-dir", default=None, help="checkpoints and logs (default: none written)")
    args = parser.parse_args(argv)
    hp = bars_small().replace(max_steps=args.max_steps)
    torch.manual_seed(hp.seed)
    train, valid = loaders()
    trainer = Trainer(problem_from_data(train=train, valid=valid), BarsNet(hp), hp,
                      strategy=Strategy(sync_every=50), output_dir=args.output_dir, eval_every=100)
    result = trainer.fit()
    print(f"done: {result.steps} steps; valid {result.metrics.get('valid')}")
    return result.metrics.get("valid", {})


if __name__ == "__main__":
    main()
