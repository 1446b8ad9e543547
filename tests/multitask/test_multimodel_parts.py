"""MultiModel's bottoms, tops and task tokens."""
from __future__ import annotations

import pytest
import torch

from mm_helpers import tiny_run
from hotloop.problems.mixing import tag_batch


def _batches(run):
    """One valid batch per task, keyed by task name."""
    return {name: next(iter(run.problem.reader(f"valid/{name}", run.hp))) for name in run.problem.names}


@pytest.mark.parametrize("extra", ["image_stem=patches", "image_stem=conv,tie_embeddings=true"])
def test_each_task_gets_its_own_output_shape(extra):
    run = tiny_run(extra)
    model = run.model.eval()
    for name, batch in _batches(run).items():
        logits, state = model(batch)
        b, t = batch["targets"].shape
        vocab = 10 if name == "image_synthetic" else 12           # classes; 10 symbols + pad + eos
        assert logits.shape == (b, t, vocab) and state is None
    assert set(model.embeddings) == {"hotloop_problems_algorithmic:12:12"}   # copy and reverse share one
    if "tie" in extra:
        vocab_key = "hotloop_problems_algorithmic:12:12"
        assert model.softmax[vocab_key].proj.weight is model.embeddings[vocab_key].tokens.weight


def test_task_token_starts_the_decoder_of_tasks_sharing_a_vocabulary():
    run = tiny_run()
    model = run.model.eval()
    copy = _batches(run)["algorithmic_copy"]
    as_reverse = tag_batch({k: v for k, v in copy.items() if not k.startswith("task:")}, "algorithmic_reverse", 1)
    with torch.no_grad():
        a, _ = model(copy)
        b, _ = model(as_reverse)
        assert not torch.allclose(a, b)                         # same tokens, another task: other outputs
        model.task_tokens.weight[1] = model.task_tokens.weight[0]
        c, _ = model(as_reverse)
    torch.testing.assert_close(a, c)                           # the task token is the only difference
