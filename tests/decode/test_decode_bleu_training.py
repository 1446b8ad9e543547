"""``--eval-bleu N``: BLEU of the first N batches of valid sentences in each evaluation row."""
from __future__ import annotations

import json

import pytest

from helpers import make_trainer
from hotloop import cli
from hotloop.decode.bleu import bleu_on_split
from hotloop.errors import UserError
from hotloop.hparams import get_hparams
from hotloop.train.bleu_during_training import BleuAtEval


def test_each_valid_row_carries_the_bleu_of_its_first_sentences(tiny_wmt):
    cls, splits, tmp = tiny_wmt
    problem = cls(data_dir=tmp / "data", raw_dir=tmp / "raw")
    problem.prepare()
    hp = get_hparams("transformer_base_small").replace(hidden_size=32, num_heads=4, filter_size=64, num_layers=1,
                                                       max_length=32, batch_size=64)
    out = tmp / "run"
    trainer = make_trainer(out, hp, problem=problem, max_steps=4, eval_every=2,
                           callbacks=[BleuAtEval(1, batch_size=4)])
    trainer.fit()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in rows if r["split"] == "valid"]
    assert {2, 4} <= {r["step"] for r in valid}            # every 2 steps (and at each epoch end)
    assert all(r["bleu_sentences"] == 4 and 0.0 <= r["bleu"] <= 100.0 and r["bleu_seconds"] > 0 for r in valid)
    # the logged score is the score of the trained model on the same sentences
    again = bleu_on_split(trainer.model, problem, hp, "valid", beam_size=1, max_batches=1, batch_size=4)
    assert again.score == valid[-1]["bleu"]
    assert trainer.last_metrics["valid"]["bleu"] == valid[-1]["bleu"]


def test_bad_settings_are_one_clear_error(tmp_path, capsys):
    with pytest.raises(UserError, match="at least 1 batch"):
        BleuAtEval(0)
    with pytest.raises(UserError, match="beam size"):
        BleuAtEval(1, beam_size=0)
    code = cli.main(["train", "--problem", "algorithmic_reverse", "--eval-bleu", "2", "--max-steps", "1",
                    "--output-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "text translation problem" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_bleu_of_a_multimodel_run_decodes_its_translation_task(tiny_wmt):
    from hotloop.problems.multi_problem import MultiProblem
    from hotloop.registry import models
    cls, splits, tmp = tiny_wmt
    problem = cls(data_dir=tmp / "data", raw_dir=tmp / "raw")
    problem.prepare()
    multi = MultiProblem([problem])
    hp = get_hparams("multimodel_tiny").replace(hidden_size=16, filter_size=32, num_heads=2, max_length=32)
    model = models.get("multimodel")(hp, multi.spec(hp)).eval()
    named = bleu_on_split(model, multi, hp, f"valid/{problem.name}", beam_size=2, max_batches=1, batch_size=4)
    assert named.sentences == 4 and len(named.hypotheses) == 4 and 0.0 <= named.score <= 100.0
    only = bleu_on_split(model, multi, hp, "valid", beam_size=2, max_batches=1, batch_size=4)
    assert only.hypotheses == named.hypotheses           # the run's only translation task
