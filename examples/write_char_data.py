"""Write the example data set: ``train.csv`` and ``valid.csv`` of words and their Caesar encryption.

    python examples/write_char_data.py DIR [--shift 3]

Stands in for your own files: any CSV with ``source,target`` columns of lowercase
words works with ``examples/char_components.py``.
"""
from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def caesar(word: str, shift: int) -> str:
    return "".join(ALPHABET[(ALPHABET.index(c) + shift) % len(ALPHABET)] for c in word)


def random_words(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 8))) for _ in range(count)]


def write_caesar_csv(directory: str | Path, *, train: int = 2000, valid: int = 200, shift: int = 3,
                     seed: int = 0) -> Path:
    """Write ``directory/{train,valid}.csv``; returns ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count, split_seed in (("train", train, seed), ("valid", valid, seed + 1)):
        with open(directory / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["source", "target"])
            writer.writerows((w, caesar(w, shift)) for w in random_words(count, split_seed))
    return directory


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--shift", type=int, default=3)
    args = parser.parse_args()
    print(f"wrote {write_caesar_csv(args.directory, shift=args.shift)}")
