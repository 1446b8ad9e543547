"""A finished run stays finished: ``--resume`` past its limit says so and changes nothing.

:func:`finished_message` looks at the newest checkpoint that verifies (damaged
newer ones are set aside first, as a resume would) and reads its step and epoch
from its manifest (from the checkpoint itself when it has none). When that
checkpoint already reached ``max_steps`` or ``max_epochs``, ``hotloop train
--resume`` prints the message and exits 0 before it builds, evaluates or writes
anything: ``metrics.jsonl``, the checkpoints and the run files stay byte-identical.
A raised limit trains on.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .checkpoint import CheckpointManager, load_checkpoint
from .manifest import read_manifest

__all__ = ["checkpoint_position", "finished_message"]


def checkpoint_position(path: Path) -> tuple[int, int]:
    """``(step, epoch)`` of a verified checkpoint: from its manifest, else from its metadata."""
    record = read_manifest(path)
    if record is not None and isinstance(record.get("step"), int) and isinstance(record.get("epoch"), int):
        return record["step"], record["epoch"]
    meta = load_checkpoint(path, verify=False)["meta"]
    return int(meta.get("step", 0)), int(meta.get("epoch", 0))


def finished_message(output_dir: str | Path, max_steps: int, max_epochs: int, *, writer: bool = True,
                     notify: Callable[[str], None] = print) -> str | None:
    """One line when run ``output_dir`` already reached ``max_steps`` / ``max_epochs``; else None."""
    manager = CheckpointManager(Path(output_dir) / "checkpoints", writer=writer)
    path = manager.newest_verified(notify)
    if path is None:
        return None
    step, epoch = checkpoint_position(path)
    if max_steps and step >= max_steps:
        limit = f"its --max-steps {max_steps}"
        flag = "--max-steps"
    elif max_epochs and epoch >= max_epochs:
        limit = f"its --max-epochs {max_epochs}"
        flag = "--max-epochs"
    else:
        return None
    return (f"resume: {output_dir} already finished at step {step} (epoch {epoch}), {limit}; nothing to do "
            f"(raise {flag} to train further; {path.name} is its last checkpoint)")
