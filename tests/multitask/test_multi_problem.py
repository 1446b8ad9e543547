"""Building multi-problem runs from names, their readers and their eval rows."""
from __future__ import annotations

import json

import pytest
import torch

from mm_helpers import PROBLEMS, make_multi_trainer, tiny_run
from hotloop.errors import UserError
from hotloop.models.base import ModelMismatchError
from hotloop.problems.mixing import task_of
from hotloop.problems.multi_problem import MultiProblem
from hotloop.registry import problems
from hotloop.compose.build import resolve_names
from hotloop.train.evaluation import evaluate_reader


def test_names_resolve_to_a_multi_problem_with_typed_mixing_hparams():
    problem_cls, model_cls, name, hp = resolve_names(
        "algorithmic_copy, algorithmic_reverse", "multimodel", None, "mixing=rates,mixing_rates=1:3")
    assert issubclass(problem_cls, MultiProblem) and name == "multimodel_base"
    assert hp.mixing == "rates" and hp.mixing_rates == (1.0, 3.0)
    problem = problem_cls()
    assert problem.names == ["algorithmic_copy", "algorithmic_reverse"]
    assert problem.eval_splits == ("valid/algorithmic_copy", "valid/algorithmic_reverse")
    probs = problem.reader("train", hp.replace(batch_size=8)).probabilities
    assert probs.tolist() == [0.25, 0.75]
    # one name with multimodel is a one-problem MultiProblem (the single-task baseline, same body)
    single, *_ = resolve_names("algorithmic_copy", "multimodel", "multimodel_tiny")
    assert issubclass(single, MultiProblem) and single().names == ["algorithmic_copy"]


@pytest.mark.parametrize("problem,model,error", [
    ("algorithmic_copy,algorithmic_copy", "multimodel", UserError),
    ("algorithmic_copy,,image_synthetic", "multimodel", UserError),
    ("algorithmic_copy,algorithmic_reverse", "transformer", ModelMismatchError),
])
def test_bad_lists_are_one_line_errors(problem, model, error):
    with pytest.raises(error):
        resolve_names(problem, model, "multimodel_tiny")


def test_raw_dir_is_refused_for_several_problems():
    problem_cls, *_ = resolve_names(PROBLEMS, "multimodel", "multimodel_tiny")
    with pytest.raises(UserError, match="raw-root"):
        problem_cls(raw_dir="/tmp/raw")


def test_eval_split_reader_is_the_problem_reader_tagged():
    run = tiny_run()
    hp = run.hp
    mine = list(run.problem.reader("valid/algorithmic_reverse", hp, shuffle=False))
    alone = list(problems.get("algorithmic_reverse")().reader("valid", hp, seed=1009, shuffle=False))
    assert len(mine) == len(alone) == 2
    for tagged, plain in zip(mine, alone):
        assert task_of(tagged) == "algorithmic_reverse"
        assert int(tagged["task:algorithmic_reverse"]) == 1
        assert torch.equal(tagged["inputs"], plain["inputs"]) and torch.equal(tagged["targets"], plain["targets"])
    chained = list(run.problem.reader("valid", hp))
    assert [task_of(b) for b in chained] == ["algorithmic_copy"] * 2 + ["algorithmic_reverse"] * 2 + \
        ["image_synthetic"] * 2


def test_trainer_writes_one_eval_row_per_problem(tmp_path):
    trainer = make_multi_trainer(tmp_path, max_steps=6, eval_every=3)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["split"]) for r in rows if r.get("split", "train") != "train"]
    splits = ["valid/algorithmic_copy", "valid/algorithmic_reverse", "valid/image_synthetic"]
    assert evals == [(3, s) for s in splits] + [(6, s) for s in splits]
    # each row is that problem's own metrics: re-evaluate the final model on each problem alone
    last = {r["split"]: r for r in rows if r.get("step") == 6 and r.get("split") in splits}
    for i, split in enumerate(splits):
        name = split.split("/")[1]
        plain = problems.get(name)().reader("valid", trainer.hp, seed=i * 1009, shuffle=False)
        tagged = ({**b, f"task:{name}": torch.tensor([i])} for b in plain)
        expected = evaluate_reader(trainer.model, tagged, device=torch.device("cpu"))
        assert last[split]["loss"] == pytest.approx(expected["loss"], rel=1e-6)
        assert last[split]["examples"] == expected["examples"] == 16


def test_data_dir_is_a_root_with_one_folder_per_problem(tmp_path):
    problem_cls, *_ = resolve_names("algorithmic_copy,ptb_lm", "multimodel", "multimodel_tiny")
    problem = problem_cls(data_dir=tmp_path)
    assert problem.subproblem("ptb_lm").data_dir == tmp_path / "ptb_lm"
    assert problem.subproblem("algorithmic_copy").data_dir == tmp_path / "algorithmic_copy"


def test_one_problem_run_reads_what_the_problem_reads_alone():
    run = tiny_run(problems="algorithmic_copy")
    mixed = list(run.problem.reader("train", run.hp, shuffle=True))
    alone = list(problems.get("algorithmic_copy")().reader("train", run.hp, shuffle=True))
    assert len(mixed) == len(alone) == 6
    assert all(torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["targets"], b["targets"])
               and task_of(a) == "algorithmic_copy" for a, b in zip(mixed, alone))
