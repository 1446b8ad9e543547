"""Best checkpoint per problem, and bitwise resume of a mixed run."""
from __future__ import annotations

import json

import pytest
import torch

from helpers import StopAt
from mm_helpers import make_multi_trainer
from hotloop.engine import Strategy
from hotloop.train.best_per_split import best_checkpoint_for
from hotloop.train.checkpoint import load_checkpoint

SPLITS = ("valid/algorithmic_copy", "valid/algorithmic_reverse", "valid/image_synthetic")


def test_best_checkpoint_per_problem_survives_pruning(tmp_path):
    # lr high enough that some problem's loss goes up and down: the bests fall on different steps
    trainer = make_multi_trainer(tmp_path, "learning_rate=0.02", max_steps=12, eval_every=2, keep_last=1)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.get("split") in SPLITS:
            losses.setdefault(r["step"], {})[r["split"]] = r["loss"]
    expected = {s.split("/")[1]: min(losses, key=lambda step: losses[step][s]) for s in SPLITS}
    expected["mean"] = min(losses, key=lambda step: sum(losses[step].values()))
    record = json.loads((tmp_path / "checkpoints" / "best_per_split.json").read_text())
    assert {name: entry["step"] for name, entry in record.items()} == expected
    ckpts = tmp_path / "checkpoints"
    assert len(list(ckpts.glob("step-*.ckpt"))) <= 2      # keep_last=1 plus the overall best
    for name, step in expected.items():
        path = best_checkpoint_for(tmp_path, name)
        assert path is not None and path.name == f"best-{name}.ckpt"
        assert load_checkpoint(path)["meta"]["step"] == step
        assert record[name]["loss"] == pytest.approx(
            losses[step][f"valid/{name}"] if name != "mean" else sum(losses[step].values()) / 3)



def _params(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("prefetch", [0, 2])
def test_mixed_run_resumes_bitwise(tmp_path, prefetch):
    # 18 mixed batches per epoch (6 per problem); stop mid-epoch at 7 with the tasks' own readers
    # mid-way, finish in the next epoch; dropout exercises the RNG state
    kwargs = dict(strategy=Strategy(prefetch=prefetch), eval_every=4)
    extra = "dropout=0.1,mixing=rates,mixing_rates=3:1:2"
    straight = make_multi_trainer(tmp_path / "straight", extra, max_steps=22, **kwargs)
    straight.fit()
    first = make_multi_trainer(tmp_path / "resumed", extra, max_steps=22, callbacks=[StopAt(7)], **kwargs)
    assert first.fit().steps == 7
    second = make_multi_trainer(tmp_path / "resumed", extra, max_steps=22, **kwargs)
    assert second.fit(resume=True).steps == 22
    a, b = _params(straight), _params(second)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    # the comparison can fail: resuming with the mixing reader rewound to the epoch start differs
    third = make_multi_trainer(tmp_path / "rewound", extra, max_steps=22, callbacks=[StopAt(7)], **kwargs)
    third.fit()
    fourth = make_multi_trainer(tmp_path / "rewound", extra, max_steps=22, **kwargs)
    position = fourth.load_checkpoint(fourth.checkpoints.latest())
    position["reader"] = None                                  # forget the exact position...
    position["consumed"] = 0                                   # ...and restart the epoch
    fourth._loop(position)
    c = _params(fourth)
    assert any(not torch.equal(a[k], c[k]) for k in a)
