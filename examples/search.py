"""A hyperparameter search with ``hotloop search`` over ``examples/search_space.yaml``.

    python examples/search.py --trials 6 --output-dir searches/example

is the command line

    hotloop search --problem algorithmic_reverse --model mlp --hparams mlp_algorithmic \\
        --override "filter_size=32,batch_size=16,eval_examples=64,warmup_steps=0" \\
        --max-steps 200 --eval-every 50 --space examples/search_space.yaml --trials 6 --output-dir DIR

Run it again with a larger ``--trials`` to continue the same study; then repeat the best trial
with ``hotloop train --config DIR/best.json --output-dir runs/best``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hotloop import cli

SPACE = Path(__file__).resolve().parent / "search_space.yaml"


def main(argv: list[str] | None = None) -> dict:
    """Run the search; returns ``DIR/best.json`` as a dict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--output-dir", default="searches/example")
    args = parser.parse_args(argv)
    code = cli.main(["search", "--problem", "algorithmic_reverse", "--model", "mlp", "--hparams", "mlp_algorithmic",
                     "--override", "filter_size=32,batch_size=16,eval_examples=64,warmup_steps=0",
                     "--max-steps", str(args.max_steps), "--eval-every", str(args.eval_every),
                     "--strategy", "default", "--loggers", "jsonl", "--space", str(SPACE),
                     "--trials", str(args.trials), "--jobs", str(args.jobs), "--output-dir", args.output_dir])
    if code != 0:
        raise SystemExit(code)
    return json.loads((Path(args.output_dir) / "best.json").read_text())


if __name__ == "__main__":
    best = main()
    print("best overrides:", best["overrides"])
