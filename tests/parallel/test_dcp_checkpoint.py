"""Sharded (DCP) checkpoints of multi-process runs: bitwise resume, other world sizes, async, safety.

Two jobs (4 ranks, then 2 ranks; ``dcp_runs.py``) are spawned once per module; the one-process
resumes and the checks run here. The 9-step 2-rank run with checkpoints at 3, 6 and 9 is the
reference every other run is compared with.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import dcp_runs
from hotloop import cli
from hotloop.train.checkpoint import CheckpointError, CheckpointManager, load_checkpoint
from hotloop.train.dcp_io import SafeFileSystemReader, load_full
from hotloop.train.manifest import write_dir_manifest

DIR = dcp_runs.DIR


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dcp")
    torch.set_num_threads(1)
    for world in (4, 2):
        mp.start_processes(dcp_runs.worker, args=(world, str(out / f"rendezvous-{world}"), str(out)),
                           nprocs=world, start_method="spawn")
    dcp_runs.run(out / "single-from2", 9, resume=out / "stopped" / DIR.format(5))
    dcp_runs.run(out / "single-from4", 9, resume=out / "w4" / DIR.format(5))
    dcp_runs.run(out / "single-from-reduce", 9, resume=out / "reduce" / DIR.format(5))
    dcp_runs.run(out / "single-from-fsdp", 9, resume=out / "fsdp" / DIR.format(5))
    dcp_runs.lstm_run(out / "lstm-single", 4)
    dcp_runs.lstm_run(out / "lstm-from2", 4, resume=out / "lstm2" / DIR.format(2))
    return out


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded checkpoint, by flat key (model and optimizer)."""
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
    walk("", load_full(path))
    return flat


def final_state(run_dir: Path, step: int = 9) -> dict:
    path = CheckpointManager(run_dir / "checkpoints").latest()
    assert path is not None and path.name == f"step-{step:08d}" + path.suffix, path
    return load_checkpoint(path)


def steps_seen(run_dir: Path) -> dict[int, set[int]]:
    """Global batch (as a set of row ids) of every step, over all ranks and resumed parts."""
    seen: dict[int, set[int]] = {}
    for path in run_dir.glob("ids-*.json"):
        start = int(path.stem.split("-")[2])
        for offset, ids in enumerate(json.loads(path.read_text())):
            seen.setdefault(start + offset + 1, set()).update(ids)
    return seen


def assert_close_states(got: dict, ref: dict) -> None:
    assert got["meta"]["step"] == ref["meta"]["step"]
    for key, value in ref["model"].items():
        torch.testing.assert_close(got["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for index, state in ref["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got["optimizer"]["state"][index][name], state[name], rtol=1e-4,
                                       atol=1e-9, msg=f"{index}.{name}")


@pytest.mark.timeout(300)
def test_layout_one_file_per_rank_and_replicated_tensors_written_once(runs: Path) -> None:
    path = runs / "straight" / DIR.format(3)
    names = sorted(p.name for p in path.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "main.ckpt", "manifest.json",
                     "rank-00000.ckpt", "rank-00001.ckpt"]
    stored = SafeFileSystemReader(str(path)).read_metadata().storage_data     # where each tensor's bytes are
    written = sum((path / n).stat().st_size for n in names if n.endswith(".distcp"))
    assert sum(info.length for info in stored.values()) == written   # DDP's replicas: written once, by one rank
    assert {info.relative_path for info in stored.values()} == {"__0_0.distcp", "__1_0.distcp"}
    assert not list((runs / "straight" / "checkpoints").glob(".tmp-*"))


@pytest.mark.timeout(300)
def test_fsdp_ranks_write_their_own_shards(runs: Path) -> None:
    stored = SafeFileSystemReader(str(runs / "fsdp" / DIR.format(5))).read_metadata().storage_data
    files = {}
    for index, info in stored.items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    sharded = [fqn for fqn, where in files.items() if len(where) == 2]
    assert any(fqn.startswith("model.") for fqn in sharded)         # a parameter: one piece per rank
    assert any(fqn.startswith("optimizer.state.") for fqn in sharded)   # and its Adam state


@pytest.mark.timeout(300)
def test_resume_at_the_same_world_size_is_bitwise(runs: Path) -> None:
    ref, got = tensors(runs / "straight" / DIR.format(9)), tensors(runs / "stopped" / DIR.format(9))
    assert ref.keys() == got.keys() and len(ref) > 10
    for key, value in ref.items():
        assert torch.equal(got[key], value), key
    assert steps_seen(runs / "stopped") == steps_seen(runs / "straight")


@pytest.mark.timeout(300)
def test_async_save_equals_sync_save(runs: Path) -> None:
    for step in (3, 6, 9):
        ref, got = tensors(runs / "straight" / DIR.format(step)), tensors(runs / "async" / DIR.format(step))
        assert ref.keys() == got.keys()
        for key, value in ref.items():
            assert torch.equal(got[key], value), f"step {step}: {key}"
        meta = load_checkpoint(runs / "async" / DIR.format(step))["meta"]
        assert meta["step"] == step and meta["world_size"] == 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", ["from4", "single-from2", "single-from4", "single-from-reduce", "single-from-fsdp",
                                 "fsdp-from2"])
def test_resume_on_another_world_size(runs: Path, run: str) -> None:
    """4 -> 2, 2 -> 1, 4 -> 1, Reduce mode's and FSDP's 2 -> 1, DDP's 2 -> FSDP's 2: the same parameters
    and optimizer state, and
    after the resume exactly the global batches the unresharded run saw, each row once per epoch."""
    assert_close_states(final_state(runs / run), final_state(runs / "straight"))
    head = {"from4": "w4", "single-from2": "stopped", "single-from4": "w4", "single-from-reduce": "reduce",
            "single-from-fsdp": "fsdp", "fsdp-from2": "stopped"}[run]
    seen = {**{s: ids for s, ids in steps_seen(runs / head).items() if s <= 5}, **steps_seen(runs / run)}
    assert seen == steps_seen(runs / "straight")                # steps 1-5 before, 6-9 after the resume
    for first, last in ((1, 6), (7, 9)):                        # epoch 0, and most of epoch 1
        rows = [i for step in range(first, last + 1) for i in seen[step]]
        assert len(rows) == len(set(rows)) == (last - first + 1) * dcp_runs.HP.batch_size


@pytest.mark.timeout(300)
def test_a_half_written_or_damaged_checkpoint_is_never_latest(runs: Path, tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(runs / "straight" / "checkpoints", ckpts)
    partial = ckpts / ".tmp-step-00000012.dcp"             # a save killed before its rename
    shutil.copytree(ckpts / "step-00000009.dcp", partial)
    (partial / "manifest.json").unlink()
    manager = CheckpointManager(ckpts)
    assert manager.newest_verified().name == "step-00000009.dcp"
    shutil.copytree(partial, ckpts / "step-00000012.dcp")  # complete-looking, but no manifest
    notes: list[str] = []
    assert manager.newest_verified(notes.append).name == "step-00000009.dcp"
    assert "manifest" in notes[-1] and (ckpts / "step-00000012.dcp.corrupt").is_dir()
    shard = ckpts / "step-00000009.dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert manager.newest_verified(notes.append).name == "step-00000006.dcp"
    assert "sha256" in notes[-1]


@pytest.mark.timeout(300)
def test_metadata_naming_other_objects_is_not_unpickled(runs: Path, tmp_path: Path) -> None:
    path = tmp_path / "step-00000003.dcp"
    shutil.copytree(runs / "straight" / DIR.format(3), path)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))
    (path / ".metadata").write_bytes(pickle.dumps(Payload()))
    write_dir_manifest(path, step=3, world_size=2)          # even with a manifest that matches
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.timeout(300)
def test_eval_and_export_read_a_sharded_checkpoint(runs: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    run_dir = runs / "registered"
    path = CheckpointManager(run_dir / "checkpoints").latest()
    assert path is not None and path.suffix == ".dcp"
    assert cli.main(["eval", "--output-dir", str(run_dir), "--splits", "valid", "--device", "cpu"]) == 0
    assert "valid: loss=" in capsys.readouterr().out
    out = tmp_path / "export"
    assert cli.main(["export", "--checkpoint", str(path), "--format", "safetensors", "--out", str(out)]) == 0
    from safetensors.torch import load_file
    exported = load_file(str(next(out.glob("*.safetensors"))))
    for key, value in load_checkpoint(path)["model"].items():
        assert torch.equal(exported[key], value), key


@pytest.mark.timeout(300)
def test_streamed_lm_resumes_in_one_process_with_every_ranks_carried_state(runs: Path) -> None:
    """2 ranks x 2 streams for 2 steps, then 1 process with all 4 streams: the same as 1 process
    throughout (the carried LSTM state of both ranks was saved and joined)."""
    saved = load_checkpoint(runs / "lstm2" / DIR.format(2))
    assert saved["train_state"]["carried"][0].shape[1] == 2         # rank 0's 2 of the 4 streams
    got, ref = final_state(runs / "lstm-from2", 4), final_state(runs / "lstm-single", 4)
    for key, value in ref["model"].items():
        torch.testing.assert_close(got["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for a, b in zip(got["train_state"]["carried"], ref["train_state"]["carried"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
