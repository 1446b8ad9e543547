"""A checkpoint as the states of named components, saved and restored by one loop each.

A run hands over a mapping ``{name: component}`` (each with ``state_dict`` /
``load_state_dict``, :class:`hotloop.train.stateful.Stateful`) and a description of
the run (step, epoch, hparams, strategy, run info, validation loss). The checkpoint
file keeps the split of :mod:`hotloop.train.checkpoint`: ``meta`` is JSON (the
description, ``format_version``, and the components whose state is JSON data:
:data:`META_COMPONENTS`), every other component's state is stored as tensors and
plain data under its name; loading never unpickles objects.

``meta["format_version"]`` names the layout (:data:`STATE_FORMAT_VERSION`). Version 1
(no ``format_version``) kept the loop's counters, metrics and Python RNG state in
``meta`` and the carried model state under ``"state"``; it is read by
:func:`_states_v1`. A checkpoint of another version is refused in one line.

A sharded checkpoint (multi-process runs, :mod:`hotloop.train.dcp_checkpoint`) splits the same
states three ways (:func:`sharded_contents`): model and optimizer tensors through DCP, the
components alike on every rank once, and the per-rank ones (random generators, carried model
state) once per rank; :func:`restore_components` reads it on any world size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ..class_lookup import resolve_hparams_class
from ..hparams import HParams, HParamsError, hparams_to_dict
from .checkpoint import CheckpointError, load_checkpoint
from .dcp_checkpoint import PER_RANK, TENSOR_KEYS, has_dtensors, is_sharded, load_model_and_optimizer, rank_states, read_sharded
from .stateful import Stateful, StateMismatch

__all__ = ["checkpoint_contents", "sharded_contents", "restore_components", "hparams_differences",
           "STATE_FORMAT_VERSION", "READABLE_VERSIONS", "META_COMPONENTS"]

STATE_FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: components whose state is JSON data, kept readable in ``meta``
META_COMPONENTS = frozenset({"schedule", "callbacks", "precision"})
_DESCRIPTION = ("step", "epoch", "hparams")   # every checkpoint's meta has these
_RUN_LIMITS = ("max_steps", "max_epochs")     # may change on resume without a notice


def checkpoint_contents(components: Mapping[str, Stateful], description: Mapping[str, Any]
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, tensors)`` for :meth:`CheckpointManager.save`: every component's state under its name.

    Every rank calls this (a component may gather across ranks); only one writes the result.
    """
    meta: dict[str, Any] = {**description, "format_version": STATE_FORMAT_VERSION}
    tensors: dict[str, Any] = {}
    for name, component in components.items():
        (meta if name in META_COMPONENTS else tensors)[name] = component.state_dict()
    return meta, tensors


def sharded_contents(components: Mapping[str, Stateful], description: Mapping[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(meta, main, own)`` for :meth:`CheckpointManager.save_sharded`: the states other than the model
    and optimizer (DCP saves those), split into the ones alike on every rank and this rank's own."""
    meta: dict[str, Any] = {**description, "format_version": STATE_FORMAT_VERSION}
    main: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for name, component in components.items():
        if name not in TENSOR_KEYS:
            target = own if name in PER_RANK else meta if name in META_COMPONENTS else main
            target[name] = component.state_dict()
    if isinstance(main.get("train_state"), dict):
        own["carried"] = main["train_state"].pop("carried", None)
    return meta, main, own


def hparams_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: saved -> current`` for every differing field except run limits."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key in _RUN_LIMITS or key == "__class__":
            continue
        a, b = saved.get(key), current.get(key)
        if (list(a) if isinstance(a, (list, tuple)) else a) != (list(b) if isinstance(b, (list, tuple)) else b):
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def _check_hparams_class(saved: Any, hp: HParams, path: Path) -> None:
    """The saved hparams name a class hotloop knows (resolved without importing what they name)."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} has hparams that are not a mapping")
    qual = saved.get("__class__")
    if qual and qual != hparams_to_dict(hp)["__class__"]:
        try:
            resolve_hparams_class(qual)
        except HParamsError as exc:
            raise CheckpointError(f"checkpoint {path}: {exc}") from None


def _states_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """The component states of a version-1 checkpoint (counters and Python RNG state in meta)."""
    meta = payload["meta"]
    return {
        "model": payload["model"], "optimizer": payload["optimizer"],
        "schedule": meta["schedule"], "callbacks": meta["callbacks"],
        # before the Precision object the scaler's state was kept as "grad_scaler"
        "precision": meta.get("precision") or {"scaler": meta.get("grad_scaler")},
        "reader": payload["reader"],
        "train_state": {"step": meta["step"], "epoch": meta["epoch"], "carried": payload["state"],
                        "metrics": meta.get("metrics") or {}, "evaluated": bool(meta.get("evaluated"))},
        "rng": {**payload["rng"], "python": meta["python_rng"]},
    }


def _component_states(payload: dict[str, Any], path: Path) -> dict[str, Any]:
    """Every stored component state by name, whatever the checkpoint's format version."""
    meta = payload["meta"]
    version = meta.get("format_version", 1)
    if version not in READABLE_VERSIONS:
        raise CheckpointError(f"checkpoint {path} has training-state format version {version!r}; this "
                              f"hotloop reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    for key in _DESCRIPTION:
        if key not in meta:
            raise CheckpointError(f"checkpoint {path} is incomplete: no {key!r} in its metadata")
    if version == 1:
        try:
            return _states_v1(payload)
        except KeyError as exc:
            raise CheckpointError(f"checkpoint {path} is incomplete: no {exc.args[0]!r} entry") from None
    reserved = {"format", "version", "meta"}
    return {**{k: v for k, v in payload.items() if k not in reserved},
            **{k: meta[k] for k in META_COMPONENTS if k in meta}}


def restore_components(path: Path, components: Mapping[str, Stateful], hp: HParams,
                       notify: Callable[[str], None] | None = None) -> list[str]:
    """Load ``path`` into ``components`` (in their order); returns the changed hparams.

    Raises :class:`CheckpointError` naming the file for an unreadable, incomplete, unknown-version
    or unfitting checkpoint; nothing is loaded when the checkpoint lacks a component's state.
    """
    sharded = is_sharded(path)
    fsdp = sharded and "model" in components and has_dtensors(components["model"].model)
    if sharded:
        payload = read_sharded(path, keys=() if fsdp else TENSOR_KEYS)
    else:
        payload = load_checkpoint(path, map_location="cpu", notify=notify)
    states = _component_states(payload, path)
    meta = payload["meta"]
    _check_hparams_class(meta["hparams"], hp, path)
    if sharded:
        _per_rank_states(path, states, components, notify or (lambda _line: None))
    todo = {name: c for name, c in components.items() if not (fsdp and name in TENSOR_KEYS)}
    for name in todo:
        if name not in states:
            raise CheckpointError(f"checkpoint {path} is incomplete: no {name!r} entry")
    if fsdp:
        load_model_and_optimizer(path, components)
    for name, component in todo.items():
        try:
            component.load_state_dict(states[name])
        except StateMismatch as exc:
            raise CheckpointError(f"checkpoint {path} {exc}") from None
        except (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
            detail = " ".join(str(exc).split())[:300]
            raise CheckpointError(f"checkpoint {path} has unusable {name} state: {type(exc).__name__}: "
                                  f"{detail}") from None
    return hparams_differences(meta["hparams"], hparams_to_dict(hp))


def _per_rank_states(path: Path, states: dict[str, Any], components: Mapping[str, Stateful],
                     notify: Callable[[str], None]) -> None:
    """Replace rank 0's random generators and carried state by this rank's (see ``rank_states``)."""
    import torch.distributed as dist
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model = getattr(components.get("model"), "model", None)
    mine = rank_states(path, rank, world, model, notify)
    states["rng"] = mine["rng"]
    if isinstance(states.get("train_state"), dict):
        states["train_state"] = {**states["train_state"], "carried": mine["carried"]}
