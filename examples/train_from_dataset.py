"""Train from a ``torch.utils.data.Dataset`` and a plain list, without writing a Problem class.

    python examples/train_from_dataset.py [--max-steps 300]

:func:`hotloop.problems.datasets.problem_from_data` wraps the data; the model is the
``CharTagger`` of ``examples/char_components.py`` (any SequenceModel works).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from char_components import VOCAB_SIZE, CharTagger, CharTaggerHParams, encode  # noqa: E402
from write_char_data import caesar, random_words  # noqa: E402

from hotloop.engine import Strategy  # noqa: E402
from hotloop.problems.base import ProblemSpec  # noqa: E402
from hotloop.train import Trainer  # noqa: E402
from hotloop.problems.datasets import problem_from_data  # noqa: E402


class CaesarPairs(Dataset):
    """A map-style Dataset: item ``i`` is ``(word ids, encrypted word ids)``."""

    def __init__(self, count: int, seed: int, shift: int = 3) -> None:
        self.words = random_words(count, seed)
        self.shift = shift

    def __len__(self) -> int:
        return len(self.words)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        word = self.words[index]
        return encode(word), encode(caesar(word, self.shift))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--output-dir", default=None, help="checkpoints and logs (default: none written)")
    args = parser.parse_args(argv)
    # a plain list of dict examples for validation
    valid = [{"inputs": encode(w), "targets": encode(caesar(w, 3))} for w in random_words(200, seed=1)]
    problem = problem_from_data(train=CaesarPairs(2000, seed=0), valid=valid,
                                spec=ProblemSpec(task="seq2seq", input_vocab_size=VOCAB_SIZE,
                                                 target_vocab_size=VOCAB_SIZE))
    hp = CharTaggerHParams(batch_size=32, hidden_size=64, learning_rate=3e-3, max_steps=args.max_steps)
    torch.manual_seed(hp.seed)
    trainer = Trainer(problem, CharTagger(hp, problem.spec(hp)), hp, strategy=Strategy(sync_every=50),
                      output_dir=args.output_dir, eval_every=100)
    result = trainer.fit()
    print(f"done: {result.steps} steps; valid {result.metrics.get('valid')}")
    return result.metrics.get("valid", {})


if __name__ == "__main__":
    main()
