"""Splitting readers over ranks, and the image problem / conv model (no processes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotloop.data import stream_windows
from hotloop.parallel import ShardedReader, ShardingError, shard_rows
from hotloop.problems.algorithmic import IndexedReader


def _reader(rows: int, batches: int = 4) -> IndexedReader:
    def make(rng: np.random.Generator) -> dict:
        x = torch.from_numpy(rng.integers(0, 1000, size=(rows, 3)))
        return {"inputs": x, "targets": x[:, :1].clone(), "meta": torch.tensor(7)}
    return IndexedReader(make, batches, seed=5)


def test_ranks_get_disjoint_rows_that_cover_the_batch() -> None:
    full = list(_reader(6))
    parts = [list(ShardedReader(_reader(6), r, 3)) for r in range(3)]
    for i, batch in enumerate(full):
        joined = torch.cat([parts[r][i]["inputs"] for r in range(3)])
        assert torch.equal(joined, batch["inputs"])
        assert all(parts[r][i]["meta"].item() == 7 for r in range(3))   # non-row tensors kept whole


def test_uneven_rows_drop_the_same_tail_everywhere_and_tiny_batches_are_skipped() -> None:
    batch = {"inputs": torch.arange(10).reshape(5, 2), "targets": torch.arange(5)[:, None]}
    a, b = shard_rows(batch, 0, 2), shard_rows(batch, 1, 2)
    assert a["targets"].flatten().tolist() == [0, 1] and b["targets"].flatten().tolist() == [2, 3]
    assert shard_rows(batch, 0, 6) is None
    counts = [len(list(ShardedReader(_reader(3), r, 4))) for r in range(4)]
    assert counts == [0, 0, 0, 0]   # 3 rows < 4 ranks: every rank skips every batch, no deadlock


def test_position_is_global_and_resumes() -> None:
    sharded = ShardedReader(_reader(4, batches=5), 1, 2)
    it = iter(sharded)
    first_two = [next(it), next(it)]
    state = sharded.state_dict()
    rest = list(it)
    again = ShardedReader(_reader(4, batches=5), 1, 2)
    again.load_state_dict(state)
    resumed = list(again)
    assert len(sharded) == 5 and len(first_two) + len(rest) == 5
    assert [torch.equal(x["inputs"], y["inputs"]) for x, y in zip(rest, resumed)] == [True] * 3


def test_streamed_windows_stay_contiguous_per_rank() -> None:
    tokens = np.arange(4 * 31, dtype=np.int32)
    whole = list(stream_windows(tokens, 4, 5))
    for rank in range(2):
        windows = list(ShardedReader(stream_windows(tokens, 4, 5), rank, 2))
        for i, w in enumerate(windows):
            assert torch.equal(w["inputs"], whole[i]["inputs"][2 * rank:2 * rank + 2])
            if i:
                assert torch.equal(w["inputs"][:, 0], windows[i - 1]["targets"][:, -1])


def test_stages_after_sharding_are_refused() -> None:
    with pytest.raises(ShardingError, match="before shard_reader"):
        ShardedReader(_reader(4), 0, 2).prefetch(2)
    with pytest.raises(ShardingError):
        shard_rows(["not", "a", "batch"], 0, 2)


def test_image_problem_is_resumable_and_conv_net_serves_it() -> None:
    from hotloop.hparams import get_hparams
    from hotloop.registry import models, problems
    hp = get_hparams("conv_net_base", "image_size=8,conv_channels=4:8,batch_size=6,train_examples=24")
    problem = problems.get("image_synthetic")()
    reader = problem.reader("train", hp)
    it = iter(reader)
    next(it)
    state = reader.state_dict()
    expected = next(it)
    again = problem.reader("train", hp)
    again.load_state_dict(state)
    got = next(iter(again))
    assert torch.equal(got["inputs"], expected["inputs"]) and got["inputs"].shape == (6, 3, 8, 8)
    assert got["targets"].shape == (6, 1) and got["targets"].dtype == torch.int64
    assert 0 <= int(got["targets"].min()) and int(got["targets"].max()) < hp.num_classes
    model = models.get("conv_net")(hp, problem.spec(hp))
    out = model.loss(got, with_accuracy=True)
    assert out.loss.dim() == 0 and int(out.stats["tokens"]) == 6 and int(out.stats["examples"]) == 6
    assert 0 <= int(out.stats["correct"]) <= 6


def test_image_labels_use_every_class() -> None:
    from hotloop.problems.synthetic_images import SyntheticImageHParams, SyntheticImages
    hp = SyntheticImageHParams(batch_size=512)
    labels = next(iter(SyntheticImages().reader("valid", hp)))["targets"]
    counts = torch.bincount(labels.flatten(), minlength=hp.num_classes)
    assert int(counts.min()) > 0   # a teacher that ignores classes would make the task degenerate


def test_wrapped_model_routes_training_calls_and_refuses_deepcopy(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path) -> None:
    import copy

    import torch.distributed as dist

    from hotloop.models.conv import ConvNet, ConvNetHParams
    from hotloop.parallel import ProcessGroupContext
    from hotloop.problems.synthetic_images import SyntheticImages
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        hp = ConvNetHParams(image_size=8, conv_channels=(4,), batch_size=4)
        model = ConvNet(hp, SyntheticImages().spec(hp))
        keys = list(model.state_dict())
        ctx = ProcessGroupContext("reduce", 1.0)
        wrapped, optimizer, no_sync = ctx.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
        assert wrapped is model and list(model.state_dict()) == keys and no_sync is not None
        calls = []
        monkeypatch.setattr(type(ctx.routed.ddp), "forward",
                            lambda self, *a, **k: calls.append(a[0]) or self.module(*a, **k))
        batch = next(iter(SyntheticImages().reader("train", hp)))
        model.loss(batch).loss.backward()          # training: through DDP, once (loss, not forward)
        with torch.no_grad():
            model.loss(batch)                      # no grad: direct
        assert calls == ["loss"]
        with pytest.raises(TypeError, match="deep-copied"):
            copy.deepcopy(model)
        ctx.close()
        assert "loss" not in model.__dict__ and copy.deepcopy(model) is not model
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
