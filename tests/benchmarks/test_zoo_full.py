"""``benchmarks/zoo.py --size full``: each of the seven models builds at its published size and its
reader gives batches of the real input shapes (the GPU table's configurations; nothing runs a step)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from zoo import MODEL_OF, ZOO, ZOO_FULL  # noqa: E402

from hotloop.compose.build import build_run  # noqa: E402

pytestmark = pytest.mark.timeout(300)

# model -> (input key, shape of one batch, parameters at least)
REAL = {"se_resnext50": ("inputs", (32, 3, 224, 224), 25e6), "deeplabv3plus": ("inputs", (8, 3, 513, 513), 39e6),
        "cyclegan": ("inputs", (1, 3, 256, 256), 28e6), "bert": ("inputs", (32, 128), 85e6),
        "yolov3": ("images", (16, 3, 416, 416), 60e6), "mask_rcnn": ("images", (4, 3, 800, 800), 43e6)}


def test_full_size_table_covers_the_zoo() -> None:
    assert set(ZOO_FULL) == set(ZOO)


@pytest.mark.parametrize("name", sorted(ZOO_FULL))
def test_full_size_config_builds_with_real_shapes(name: str) -> None:
    problem, hparams, overrides = ZOO_FULL[name]
    run = build_run(problem, MODEL_OF.get(name, name), hparams, overrides or None)
    batch = next(iter(run.problem.reader("train", run.hp)))
    params = sum(p.numel() for p in run.model.parameters())
    if name == "transformer_base":                                  # token batches: about 4096 tokens each
        assert run.hp.hidden_size == 512 and run.hp.num_layers == 6
        tokens = batch["inputs"].shape[0] * batch["inputs"].shape[1]
        assert 2048 < tokens <= 4096, tokens
        return
    key, shape, at_least = REAL[name]
    assert tuple(batch[key].shape) == shape
    assert params >= at_least, params


def test_the_experts_worker_feed_gives_the_same_batches_and_closes_its_workers() -> None:
    """The zoo's expert feed on a GPU (reader workers, pinned copies) gives the batches the
    training-thread feed gives, and ``close`` ends its worker processes."""
    import multiprocessing

    import torch
    from zoo import Endless

    from hotloop.problems.base import open_reader
    run = build_run("image_synthetic", "se_resnext50", "se_resnext_small", "batch_size=2")
    workers = Endless(open_reader(run.problem, "train", run.hp, workers=2), torch.device("cpu"), pin=True)
    inline = Endless(run.problem.reader("train", run.hp), torch.device("cpu"))
    for _ in range(3):
        a, b = workers.next(), inline.next()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert multiprocessing.active_children()
    workers.close()
    assert not multiprocessing.active_children()
