"""The per-rank parts of a sharded checkpoint (random generators, carried LSTM state) on any world size."""
from __future__ import annotations

from pathlib import Path

import torch

from hotloop.models.lstm_lm import LSTMLM, LSTMLMHParams
from hotloop.problems.base import ProblemSpec
from hotloop.train.checkpoint import save_checkpoint
from hotloop.train.dcp_checkpoint import rank_file, rank_states
from hotloop.train.manifest import write_dir_manifest

HP = LSTMLMHParams(hidden_size=3, num_layers=2, batch_size=8, max_length=5)
SPEC = ProblemSpec(task="lm", input_vocab_size=10, target_vocab_size=10, max_input_length=5,
                   max_target_length=5, streamed=True, pad_id=-1)


def saved(tmp_path: Path, world: int) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A checkpoint directory of ``world`` ranks, each carrying its rows of a global [L, 8, H] state."""
    h = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(2, 8, 3)   # [L, B, H]
    c = -h
    path = tmp_path / f"step-00000001-{world}.dcp"
    path.mkdir()
    rows = 8 // world
    for rank in range(world):
        part = slice(rank * rows, (rank + 1) * rows)
        save_checkpoint(path / rank_file(rank), {"rank": rank},
                        {"rng": {"torch": torch.full((3,), rank, dtype=torch.uint8)},
                         "carried": (h[:, part], c[:, part])})
    write_dir_manifest(path, world_size=world)
    return path, h, c


def test_carried_state_is_recut_for_another_world_size(tmp_path: Path) -> None:
    model, notes = LSTMLM(HP, SPEC), []
    for saved_world in (1, 2, 4):
        path, h, c = saved(tmp_path, saved_world)
        for world in (1, 2, 4):
            rows = 8 // world
            for rank in range(world):
                state = rank_states(path, rank, world, model, notes.append)
                got_h, got_c = state["carried"]
                assert torch.equal(got_h, h[:, rank * rows:(rank + 1) * rows]), (saved_world, world, rank)
                assert torch.equal(got_c, c[:, rank * rows:(rank + 1) * rows])
                expected_rng = rank if world == saved_world else 0     # re-seeded from rank 0 on a change
                assert state["rng"]["torch"].tolist() == [expected_rng] * 3
    assert any("re-cut into 2 row(s) per rank" in note for note in notes)


def test_a_state_without_a_batch_dimension_restarts_with_a_notice(tmp_path: Path) -> None:
    path, _, _ = saved(tmp_path, 2)

    class NoState:
        def initial_state(self, batch_size: int, device: torch.device) -> None:
            return None
    notes: list[str] = []
    assert rank_states(path, 0, 1, NoState(), notes.append)["carried"] is None
    assert "batch dimension is unknown" in notes[0]
