"""Does wrapping a user's DataLoader cost speed? A plain PyTorch loop vs hotloop's Trainer, same loader.

Both contenders train the same small conv net (copied from one initialisation) with Adam on
the same ``DataLoader`` (uint8 pictures ``[3, 32, 32]``, shuffled, ``--workers`` processes; a fresh
loader each round, so each contender's time includes starting its workers, as a run's does) for
``--steps`` steps per round; rounds alternate which contender goes first. The plain loop is
what a PyTorch user writes (``for x, y in loader``: cast, forward, loss, backward, step). The
hotloop contender is ``Trainer(loader, model, hp, loss_fn=...)`` with ``Strategy()`` (fp32 eager,
prefetch thread of 2), built before the timer starts; its time is ``fit()``'s wall time.

    PYTHONPATH=. python benchmarks/byo_data.py [--rounds 7] [--steps 60] [--workers 2] [--json FILE]
    PYTHONPATH=. python benchmarks/byo_data.py --smoke      # checks the script; the numbers mean nothing

Reported: steps/s medians per contender and ``hotloop_vs_plain`` = hotloop median / plain median
(1.0: no cost). Run it alone on a quiet machine.
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hotloop.engine import Strategy  # noqa: E402
from hotloop.hparams import HParams  # noqa: E402
from hotloop.models.base import LossOutput  # noqa: E402
from hotloop.train import Trainer  # noqa: E402

__all__ = ["main"]


def make_loader(count: int, batch_size: int, workers: int) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (count, 3, 32, 32), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 10, (count,), generator=gen)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0, drop_last=True)


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(width, 10))


HP = HParams(optimizer="adam", learning_rate=1e-3)


def _loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(images.float() / 255.0), labels)        # uint8 [B, 3, 32, 32] -> [B, 10]


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor], state: Any) -> LossOutput:
    return LossOutput(_loss(model, batch["inputs"], batch["targets"]), {})


def plain_round(model: nn.Module, loader: DataLoader, steps: int) -> float:
    """Steps/s of the loop a PyTorch user writes."""
    opt = torch.optim.Adam(model.parameters(), lr=HP.learning_rate, betas=(HP.adam_beta1, HP.adam_beta2),
                           eps=HP.adam_epsilon)
    done, start = 0, time.perf_counter()
    while done < steps:
        for images, labels in loader:
            loss = _loss(model, images, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    return steps / (time.perf_counter() - start)


def hotloop_round(model: nn.Module, loader: DataLoader, steps: int) -> float:
    """Steps/s of ``Trainer.fit()`` over the same loader (construction not timed)."""
    trainer = Trainer(loader, model, HP, loss_fn=loss_fn, max_steps=steps, loggers=[], strategy=Strategy())
    start = time.perf_counter()
    result = trainer.fit()
    assert result.steps == steps
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=60, help="steps per contender per round")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=32, help="conv channels")
    parser.add_argument("--workers", type=int, default=2, help="the DataLoader's num_workers")
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--smoke", action="store_true", help="1 round of 3 steps, tiny sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps, args.batch_size, args.width, args.workers = 1, 3, 8, 4, 0
    def loader() -> DataLoader:     # a fresh loader each round: both contenders start its workers
        return make_loader(args.batch_size * max(args.steps, 8), args.batch_size, args.workers)

    initial = make_model(args.width)
    rates: dict[str, list[float]] = {"plain": [], "hotloop": []}
    contenders = {"plain": plain_round, "hotloop": hotloop_round}
    for name, run in contenders.items():                       # warm-up, not recorded
        run(copy.deepcopy(initial), loader(), min(args.steps, 5))
    for index in range(args.rounds):
        order = list(contenders) if index % 2 == 0 else list(reversed(contenders))
        for name in order:
            rates[name].append(contenders[name](copy.deepcopy(initial), loader(), args.steps))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result = {"command": "python benchmarks/byo_data.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "threads": torch.get_num_threads()},
              "smoke": args.smoke, "rounds": args.rounds, "steps": args.steps, "batch_size": args.batch_size,
              "width": args.width, "workers": args.workers, "steps_per_s": rates,
              "median_steps_per_s": medians, "hotloop_vs_plain": medians["hotloop"] / medians["plain"]}
    print(f"plain {medians['plain']:.2f} steps/s, hotloop {medians['hotloop']:.2f} steps/s, "
          f"hotloop_vs_plain {result['hotloop_vs_plain']:.3f}" + (" (smoke: meaningless)" if args.smoke else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
