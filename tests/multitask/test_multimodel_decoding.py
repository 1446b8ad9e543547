"""Decoding one seq2seq task of a multimodel: consistent with its training forward, beam 1 = greedy."""
from __future__ import annotations

import pytest
import torch

from mm_helpers import tiny_run
from hotloop.decode.bleu import translation_task
from hotloop.decode.search import beam_search, greedy_search, max_target_lengths
from hotloop.errors import UserError
from hotloop.models.base import ModelMismatchError
from hotloop.problems.base import PAD_ID
from hotloop.problems.mixing import TASK_PREFIX


@pytest.fixture(scope="module")
def run():
    built = tiny_run("dropout=0.0")
    built.model.eval()
    return built


def _source(task: str, run) -> torch.Tensor:
    batch = next(iter(run.problem.subproblem(task).reader("valid", run.hp)))
    return batch["inputs"][:4]


@pytest.mark.parametrize("task", ["algorithmic_copy", "algorithmic_reverse"])
def test_greedy_tokens_are_the_argmax_of_the_training_forward(run, task):
    decoder = run.model.decoder_for(task)
    inputs = _source(task, run)
    lengths = max_target_lengths(inputs, extra=4, cap=decoder.max_decode_length)
    tokens = greedy_search(decoder, inputs, lengths)                        # [B, T]
    assert tokens.shape[1] > 1
    # teacher-forced on its own output, the model's forward predicts that output at every position
    logits, _ = run.model({"inputs": inputs, "targets": tokens, TASK_PREFIX + task: torch.ones(())})
    predicted = logits.argmax(-1)                                           # [B, T]
    live = tokens != PAD_ID
    forced_eos = torch.arange(tokens.shape[1])[None, :] + 1 >= lengths[:, None]   # the last allowed token
    check = live & ~forced_eos
    assert check.any()
    assert torch.equal(predicted[check], tokens[check])
    one = beam_search(decoder, inputs, lengths, beam_size=1, alpha=0.6)
    assert torch.equal(one.tokens, tokens)


def test_only_seq2seq_tasks_have_a_decoder(run):
    with pytest.raises(ModelMismatchError, match="algorithmic_copy, algorithmic_reverse"):
        run.model.decoder_for("image_synthetic")
    with pytest.raises(ModelMismatchError, match="not one of"):
        run.model.decoder_for("nope")


def test_bleu_splits_name_the_task_of_a_multi_problem_run(run):
    decoder, problem, split = translation_task(run.model, run.problem, "test/algorithmic_reverse")
    assert split == "test" and problem is run.problem.subproblem("algorithmic_reverse")
    assert decoder.task.name == "algorithmic_reverse"
    with pytest.raises(UserError, match="name the translation task"):
        translation_task(run.model, run.problem, "test")          # no text translation problem here
