"""Sharded checkpoints of multi-process runs on ``torch.distributed.checkpoint`` (DCP).

A run with more than one process writes ``checkpoints/step-00000060.dcp/``, a directory:

| file | written by | holds |
|---|---|---|
| ``__R_0.distcp`` | every rank R | its shard of the model and optimizer tensors (DCP; a tensor replicated on every rank, as under DDP, is written once) |
| ``.metadata`` | rank 0 (DCP) | where each tensor's pieces are (global shapes; pickled, read by :mod:`hotloop.train.dcp_io`) |
| ``main.ckpt`` | rank 0 | the run's description and the components that are the same on every rank (schedule, callbacks, precision, reader position, counters), a hotloop checkpoint file |
| ``rank-0000R.ckpt`` | every rank R | what differs per rank: its random generators and its carried model state |
| ``manifest.json`` | rank 0, last | every file's size and sha256, the step, the world size |

Model and optimizer states come from ``torch.distributed.checkpoint.state_dict.get_state_dict``
(FQN-keyed; under FSDP their shards as DTensors). Under Reduce mode
(``ZeroRedundancyOptimizer``) every rank saves the optimizer state of its own partition, keyed
the same way, so no rank gathers the whole state.

Atomic completion: all ranks write into ``.tmp-step-00000060.dcp/``; after DCP's save has
finished on every rank (its last collective), rank 0 writes the manifest and renames the
directory to its final name. A directory without that rename is never listed, so a
half-written checkpoint is never "latest". With ``asynchronous=True`` DCP copies the state
to host memory and writes it in a background thread (``dcp.async_save`` over a gloo group of
its own), rank 0 completes the directory when the write finishes, and :meth:`ShardedSaver.wait`
(called before the next save and at the end of ``fit``) waits for it on every rank.

Reading (:func:`read_sharded`) needs no process group: a one-process ``eval``, ``export`` or
resume assembles full tensors from the metadata; resuming on N ranks gives each rank the state
its component expects (see :func:`rank_states` for the per-rank parts).
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..parallel.fsdp_state import is_sharded as model_is_sharded

from .checkpoint import CheckpointError, CorruptCheckpointError, load_checkpoint, save_checkpoint, write_failure
from .manifest import check_dir, read_dir_manifest, write_dir_manifest

# DCP (hotloop.train.dcp_io), DTensor and torch.distributed.optim are imported where they are used:
# a run of one process with single-file checkpoints never needs them
if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

__all__ = ["SUFFIX", "is_sharded", "ShardedSaver", "read_sharded", "rank_states", "fqn_to_indexed",
           "has_dtensors", "load_model_and_optimizer", "verify_sharded"]

SUFFIX = ".dcp"
MAIN_FILE = "main.ckpt"
TENSOR_KEYS = ("model", "optimizer")    # the components DCP stores
PER_RANK = ("rng",)                     # components every rank saves for itself
_GROUP: dict[str, Any] = {}


def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` names a sharded checkpoint (a ``.dcp`` directory)."""
    return Path(path).name.endswith(SUFFIX)


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.ckpt"


def verify_sharded(path: str | Path) -> None:
    """Raise :class:`CorruptCheckpointError` unless every file of ``path`` matches its manifest."""
    path = Path(path)
    try:
        reason = check_dir(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    if reason is not None:
        raise CorruptCheckpointError(path, reason)


def _dcp_group() -> Any:
    """One gloo group for DCP's own collectives (created once, by every rank, at the first save)."""
    if _GROUP.get("world") is not dist.group.WORLD:   # a new job in this process: a new group
        _GROUP.update(world=dist.group.WORLD, group=dist.new_group(backend="gloo"))
    return _GROUP["group"]


def has_dtensors(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded DTensors (FSDP)."""
    return model_is_sharded(model)


def fqn_to_indexed(state: Mapping[str, Any]) -> dict[str, Any]:
    """A FQN-keyed optimizer state (``get_optimizer_state_dict``'s) as ``torch.optim``'s index-keyed one
    (parameters numbered in the order of the groups)."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    saved = state.get("state") or {}   # DCP keeps no entry for a stateless optimizer's empty state
    return {"state": {index[name]: value for name, value in saved.items()}, "param_groups": groups}


def _zero_shard(model: nn.Module, optimizer: "ZeroRedundancyOptimizer") -> dict[str, Any]:
    """Reduce mode: this rank's partition of the state (its own keys) and every group, FQN-keyed;
    the ranks' partitions are disjoint, so together they are the full state."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    state = {names[id(p)]: dict(values) for p, values in optimizer.optim.state.items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
              for g in optimizer.param_groups]
    return {"state": state, "param_groups": groups}


def _tensor_state(components: Mapping[str, Any]) -> dict[str, Any]:
    """``{"model", "optimizer"}`` for DCP (a collective under FSDP: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model, optimizer = components["model"].model, components["optimizer"].optimizer
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return {"model": get_model_state_dict(model), "optimizer": _zero_shard(model, optimizer)}
    model_state, optimizer_state = get_state_dict(model, optimizer)   # FSDP: this rank's DTensor shards
    return {"model": model_state, "optimizer": optimizer_state}


class ShardedSaver:
    """Writes sharded checkpoints into ``directory``; at most one asynchronous save in flight."""

    def __init__(self, directory: Path, rank: int, world_size: int) -> None:
        self.directory, self.rank, self.world_size = Path(directory), rank, world_size
        self._future: Any = None
        self._finished = threading.Event()
        self._error: list[BaseException] = []

    @property
    def pending(self) -> bool:
        return self._future is not None

    def save(self, step: int, meta: dict[str, Any], main: dict[str, Any], own: dict[str, Any],
             components: Mapping[str, Any], *, asynchronous: bool = False) -> Path:
        """Write step ``step``: ``meta`` and ``main`` (rank 0's ``main.ckpt``), ``own`` (this rank's file)
        and the model and optimizer of ``components``; returns the final path (complete on return
        unless ``asynchronous``)."""
        self.wait()
        group = _dcp_group()
        final = self.directory / f"step-{step:08d}{SUFFIX}"
        tmp = self.directory / f".tmp-{final.name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier(group=group)
        state = _tensor_state(components)
        try:
            save_checkpoint(tmp / rank_file(self.rank), {"rank": self.rank, "world_size": self.world_size,
                                                          "step": step}, own)
            if self.rank == 0:
                save_checkpoint(tmp / MAIN_FILE, meta, main)
        except FileNotFoundError:
            raise CheckpointError(f"cannot write {tmp}: the directory vanished during the save") from None
        fields = {"step": step, "epoch": meta.get("epoch"), "world_size": self.world_size}
        from torch.distributed.checkpoint import FileSystemWriter
        writer = FileSystemWriter(str(tmp), sync_files=True)
        import torch.distributed.checkpoint as dcp
        from .dcp_io import READ_ERRORS
        if not asynchronous:
            try:
                dcp.save(state, storage_writer=writer, process_group=group)
            except READ_ERRORS as exc:  # DCP wraps every rank's failure
                raise (_short(exc, tmp) or exc) from None
            if self.rank == 0:
                _complete(tmp, final, fields)
            return final
        self._finished.clear()
        self._error.clear()
        self._future = dcp.async_save(state, storage_writer=writer, process_group=group)
        if self.rank == 0:
            self._future.add_done_callback(lambda future: self._on_done(future, tmp, final, fields))
        else:
            self._finished.set()
        return final

    def _on_done(self, future: Any, tmp: Path, final: Path, fields: dict[str, Any]) -> None:
        try:
            if future.exception() is None:
                _complete(tmp, final, fields)
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error.append(exc)
        finally:
            self._finished.set()

    def wait(self) -> None:
        """Wait for the asynchronous save in flight (every rank calls it); raises its failure."""
        if self._future is None:
            return
        from .dcp_io import READ_ERRORS
        future, self._future = self._future, None
        try:
            future.result()
        except READ_ERRORS as exc:
            self._finished.wait()
            raise (_short(exc, self.directory) or CheckpointError(f"asynchronous checkpoint failed: "
                                                                   f"{str(exc).splitlines()[0][:200]}")) from None
        self._finished.wait()
        if self._error:
            raise self._error.pop()


def _short(exc: BaseException, path: Path) -> CheckpointError | None:
    failure = write_failure(exc, path)
    if failure is None and "No space left" in str(exc):
        failure = CheckpointError(f"cannot write {path}: no space left on device")
    return failure


def _complete(tmp: Path, final: Path, fields: dict[str, Any]) -> None:
    """Rank 0: the manifest of every file, then the atomic rename that makes the checkpoint visible."""
    try:
        write_dir_manifest(tmp, **fields)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except OSError as exc:
        raise (write_failure(exc, final) or exc) from None
    try:
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def read_sharded(path: str | Path, keys: tuple[str, ...] = TENSOR_KEYS, *, verify: bool = True) -> dict[str, Any]:
    """The checkpoint at ``path`` as a single-file payload: ``meta``, rank 0's component states, and the
    full tensors of ``keys`` (the optimizer index-keyed, as ``torch.optim`` saves it). One process."""
    path = Path(path)
    if verify:
        verify_sharded(path)
    payload = load_checkpoint(path / MAIN_FILE, verify=False)
    own = load_checkpoint(path / rank_file(0), verify=False)
    payload["meta"]["world_size"] = int(own["meta"].get("world_size", 1))
    for name in PER_RANK:
        payload[name] = own.get(name)
    if isinstance(payload.get("train_state"), dict):
        payload["train_state"]["carried"] = own.get("carried")
    if keys:
        from .dcp_io import READ_ERRORS, UnsafeMetadataError, load_full
        try:
            tensors = load_full(path, keys)
        except UnsafeMetadataError as exc:
            raise CheckpointError(f"cannot load checkpoint {path}: {exc}") from None
        except READ_ERRORS as exc:  # DCP wraps the cause; say it in one line
            raise CorruptCheckpointError(path, f"its tensors cannot be read ({_first_line(exc)})") from None
        if "optimizer" in tensors:
            tensors["optimizer"] = fqn_to_indexed(tensors["optimizer"])
        payload.update(tensors)
    return payload


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if "Error" in line or "refusing" in line]
    return (lines[-1] if lines else str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:200]


def load_model_and_optimizer(path: Path, components: Mapping[str, Any]) -> None:
    """Sharded model (DTensors) and optimizer: every rank reads only its shards into this run's layout."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from .dcp_io import READ_ERRORS, load_into
    model, optimizer = components["model"].model, components["optimizer"].optimizer
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        load_into(path, state, _dcp_group() if dist.is_initialized() else None)
    except READ_ERRORS as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this run: {_first_line(exc)}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _batch_dims(model: Any) -> list[int] | None:
    """For each tensor of ``model.initial_state``, the dimension that grows with the batch."""
    try:
        one, two = model.initial_state(1, torch.device("cpu")), model.initial_state(2, torch.device("cpu"))
    except Exception:  # noqa: BLE001 - a model without a carried state
        return None
    a, b = _leaves(one), _leaves(two)
    dims = []
    for x, y in zip(a, b):
        differ = [d for d in range(x.dim()) if x.shape[d] != y.shape[d]]
        if len(differ) != 1:
            return None
        dims.append(differ[0])
    return dims if len(a) == len(b) else None


def _leaves(state: Any) -> list[Tensor]:
    if isinstance(state, Tensor):
        return [state]
    if isinstance(state, (tuple, list)):
        return [t for item in state for t in _leaves(item)]
    return []


def _rebuild(template: Any, leaves: list[Tensor]) -> Any:
    if isinstance(template, Tensor):
        return leaves.pop(0)
    return type(template)(_rebuild(item, leaves) for item in template)


def rank_states(path: Path, rank: int, world_size: int, model: Any,
                notify: Callable[[str], None]) -> dict[str, Any]:
    """This rank's ``rng`` and ``carried`` states from a checkpoint written by ``saved`` ranks.

    Same world size: the rank's own file. Another world size: every rank takes rank 0's random
    generators (as a fresh run's ranks all start alike), and the carried state of all saved ranks is
    joined along its batch dimension and cut into this rank's rows.
    """
    saved = int(read_dir_manifest(path).get("world_size") or 1)
    if saved == world_size:
        own = load_checkpoint(path / rank_file(rank), verify=False)
        return {"rng": own.get("rng"), "carried": own.get("carried")}
    files = [load_checkpoint(path / rank_file(r), verify=False) for r in range(saved)]
    out = {"rng": files[0].get("rng"), "carried": None}
    carried = [f.get("carried") for f in files]
    if all(c is None for c in carried):
        return out
    dims = _batch_dims(model)
    if dims is None or any(len(_leaves(c)) != len(dims) for c in carried):
        notify(f"resume on {world_size} ranks from {saved}: the carried state's batch dimension is unknown; "
               f"it restarts from the model's initial state")
        return out
    joined = [torch.cat([_leaves(c)[i] for c in carried], dim=d) for i, d in enumerate(dims)]
    rows = joined[0].shape[dims[0]] // world_size
    mine = [t.narrow(d, rank * rows, rows).clone() for t, d in zip(joined, dims)]   # this rank's B/N rows
    out["carried"] = _rebuild(carried[0], mine)
    notify(f"resume on {world_size} ranks from a {saved}-rank checkpoint: random generators re-seeded "
           f"from rank 0's, carried state re-cut into {rows} row(s) per rank")
    return out
