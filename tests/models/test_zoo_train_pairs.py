"""Each zoo problem/model pair resolves by name and runs through the Trainer (a few steps)."""
import pytest
import torch
from helpers import raw_data_dir, require_raw_data

from hotloop.builtin import declare_builtins
from hotloop.engine import Strategy
from hotloop.registry import hparams_sets, models, problems
from hotloop.compose.build import build_run
from hotloop.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")   # the shared fixture of tests/conftest.py

RAW_PTB = raw_data_dir("ptb")                 # $HOTLOOP_RAW_ROOT/ptb (tests/conftest.py sets the root)

PAIRS = [
    ("image_mnist", "se_resnext50", "batch_size=8,stage_blocks=1:1,stem_channels=8,stage_channels=16,cardinality=2"),
    ("segment_shapes", "deeplabv3plus", "batch_size=2,image_size=32,eval_examples=4"),
    ("bert_pretrain_ptb", "bert", "batch_size=2,hidden_size=16,num_layers=1,num_heads=2,filter_size=32,"
                                  "max_length=32,eval_examples=4"),
]



def test_zoo_names_are_declared_builtins():
    declare_builtins()
    for name in ("se_resnext50", "deeplabv3plus", "bert", "cyclegan"):
        assert models.get(name).__module__.startswith("hotloop.models.")
    for name in ("image_mnist", "segment_shapes", "bert_pretrain_ptb", "bert_pretrain_multi30k",
                 "shapes_unpaired"):
        default = problems.get(name).default_hparams
        assert type(hparams_sets.get(default)()).__name__.endswith("HParams")
    for name in ("se_resnext50_imagenet", "deeplabv3plus_r50", "bert_base", "bert_tiny", "cyclegan_256"):
        hparams_sets.get(name)()


@pytest.mark.parametrize("problem, model, overrides", PAIRS, ids=[p[0] for p in PAIRS])
def test_pair_trains_and_evaluates(problem, model, overrides, tmp_path):
    if problem == "bert_pretrain_ptb":
        require_raw_data(RAW_PTB / "ptb.train.txt", "PTB")
    run = build_run(problem, model, None, overrides, data_dir=tmp_path / "data", raw_dir=RAW_PTB)
    trainer = Trainer(run.problem, run.model, run.hp, max_steps=3, strategy=Strategy(sync_every=1),
                      loggers=[])
    trainer.fit()
    metrics = trainer.evaluate("valid", max_batches=2)
    assert metrics["loss"] > 0 and 0 <= metrics["accuracy"] <= 1 and metrics["examples"] > 0
