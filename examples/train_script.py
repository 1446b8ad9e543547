"""The ``char_caesar`` run of ``examples/char_components.py`` as a plain Python script.

    python examples/train_script.py [--max-steps 300] [--output-dir runs/char_script]

It writes the example CSV files to a temporary directory (your own files would
already be somewhere), builds the problem, hparams and model from the registry,
and trains with the :class:`~hotloop.train.Trainer`.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import char_components  # noqa: E402,F401  # registers char_caesar, char_tagger, char_tagger_small
from write_char_data import write_caesar_csv  # noqa: E402

from hotloop.engine import Strategy  # noqa: E402
from hotloop.hparams import get_hparams  # noqa: E402
from hotloop.registry import models, problems  # noqa: E402
from hotloop.train import Trainer  # noqa: E402
from hotloop.compose.build import build_model  # noqa: E402
from hotloop.train.tracking import build_loggers  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--output-dir", default="runs/char_script")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data_dir:
        write_caesar_csv(data_dir)
        problem = problems.get("char_caesar")(data_dir=data_dir)
        problem.prepare()
        hp = get_hparams("char_tagger_small", {"max_steps": args.max_steps})
        model = build_model(models.get("char_tagger"), hp, problem.spec(hp))
        trainer = Trainer(problem, model, hp, strategy=Strategy(sync_every=50), output_dir=args.output_dir,
                          eval_every=100, loggers=build_loggers("jsonl,csv", args.output_dir))
        result = trainer.fit()
    print(f"done: {result.steps} steps; valid {result.metrics.get('valid')}; best {result.best_checkpoint}")
    return result.metrics.get("valid", {})


if __name__ == "__main__":
    main()
