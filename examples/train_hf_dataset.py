"""A Hugging Face ``datasets.Dataset`` built from local text, tokenized by a tokenizer trained on it.

    HOTLOOP_RAW_ROOT=DIR python examples/train_hf_dataset.py [--max-steps 150] [--output-dir runs/langid]

``DIR`` holds ``multi30k/`` (``val.{en,de}.gz`` and ``test_2016_flickr.{en,de}.gz``). The task
tells English from German sentences: the train dataset is made with ``Dataset.from_dict`` from
the validation files, the evaluated one from the 2016 test files. Nothing is downloaded: a
``tokenizers`` WordLevel tokenizer is trained on the training sentences, ``dataset.map``
tokenizes the ``text`` column into ``input_ids`` (cast to int32; the model receives int32), and
``columns=`` maps the columns onto the batch keys the model reads. The vocabulary size comes
from the train column (``problem.spec(hp).input_vocab_size``).
"""
from __future__ import annotations

import argparse
import gzip
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hotloop.data import default_raw_dir
from hotloop.engine import Strategy
from hotloop.errors import UserError
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput, token_stats
from hotloop.problems.datasets import problem_from_data
from hotloop.train import Trainer

SPECIALS = ["[PAD]", "[EOS]", "[UNK]"]          # ids 0 (padding, as hotloop pads), 1, 2


def read_sentences(raw: Path, stem: str) -> tuple[list[str], list[int]]:
    """The English (label 0) and German (label 1) sentences of ``<raw>/<stem>.{en,de}.gz``."""
    texts: list[str] = []
    labels: list[int] = []
    for label, lang in enumerate(("en", "de")):
        path = raw / f"{stem}.{lang}.gz"
        if not path.is_file():
            raise UserError(f"{path} is missing: set HOTLOOP_RAW_ROOT to the directory holding multi30k/")
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = [line.strip().lower() for line in handle if line.strip()]
        texts += lines
        labels += [label] * len(lines)
    return texts, labels


def train_tokenizer(texts: list[str], vocab_size: int = 4000) -> Any:
    """A WordLevel tokenizer learnt from ``texts`` (no hub, no files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    return tokenizer


def build_datasets(raw: Path) -> tuple[Any, Any]:
    """(train, valid) ``datasets.Dataset`` (from the Multi30k folder ``raw``) with columns ``text``, ``label``, ``input_ids`` (int32)."""
    import datasets
    datasets.disable_progress_bars()
    train_text, train_labels = read_sentences(raw, "val")
    valid_text, valid_labels = read_sentences(raw, "test_2016_flickr")
    tokenizer = train_tokenizer(train_text)

    def tokenize(rows: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"input_ids": [enc.ids for enc in tokenizer.encode_batch(rows["text"])]}

    ids = datasets.Sequence(datasets.Value("int32"))
    out = []
    for texts, labels in ((train_text, train_labels), (valid_text, valid_labels)):
        ds = datasets.Dataset.from_dict({"text": texts, "label": labels})
        out.append(ds.map(tokenize, batched=True).cast_column("input_ids", ids))
    return out[0], out[1]


class BagOfWords(nn.Module):
    """Mean of the word embeddings of a sentence (padding left out) -> 2 logits."""

    def __init__(self, vocab_size: int, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width, padding_idx=0)
        self.out = nn.Linear(width, 2)

    def loss(self, batch: dict[str, torch.Tensor], state: Any = None, with_accuracy: bool = False) -> LossOutput:
        ids = batch["inputs"]                                           # int32 [B, L], 0 = padding
        mask = (ids != 0).unsqueeze(-1)                                 # [B, L, 1]
        summed = (self.embed(ids) * mask).sum(dim=1)                    # [B, H]
        logits = self.out(summed / mask.sum(dim=1).clamp(min=1))        # [B, 2]
        loss, stats = token_stats(logits[:, None, :], batch["targets"][:, None], with_accuracy=with_accuracy,
                                  pad_id=-1)                            # one target per sentence, no padding
        return LossOutput(loss, stats, weight=stats["tokens"])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--output-dir", default=None, help="checkpoints and logs (default: none written)")
    args = parser.parse_args(argv)
    train, valid = build_datasets(default_raw_dir("multi30k"))
    problem = problem_from_data(train=train, valid=valid, columns={"inputs": "input_ids", "targets": "label"})
    hp = HParams(batch_size=32, learning_rate=1e-2, max_steps=args.max_steps)
    torch.manual_seed(hp.seed)
    model = BagOfWords(problem.spec(hp).input_vocab_size)
    trainer = Trainer(problem, model, hp, strategy=Strategy(sync_every=50), output_dir=args.output_dir,
                      eval_every=50)
    result = trainer.fit()
    print(f"done: {result.steps} steps; valid {result.metrics.get('valid')}")
    return result.metrics.get("valid", {})


if __name__ == "__main__":
    main()
