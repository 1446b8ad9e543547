"""Typed, frozen hyper-parameters with string overrides.

An hparams *set* is a function registered in :data:`hotloop.registry.hparams_sets`
that returns an :class:`HParams` (or a subclass adding model fields). Sets are
derived from one another with :func:`dataclasses.replace`::

    @hparams_sets.register("transformer_tiny")
    def transformer_tiny() -> TransformerHParams:
        return replace(transformer_base(), hidden_size=64)
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import UserError

__all__ = ["HParams", "HParamsError", "apply_overrides", "parse_overrides",
           "hparams_to_dict", "hparams_from_dict", "get_hparams"]

H = TypeVar("H", bound="HParams")


class HParamsError(UserError, ValueError):
    """A bad override string, unknown key or wrong type."""


@dataclass(frozen=True)
class HParams:
    """Fields shared by every model; models subclass this to add their own."""

    # data
    batch_size: int = 64          # examples (rows for streamed LMs) per optimizer micro-batch
    max_length: int = 0           # 0 = the problem's default
    # optimisation
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-9
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    lr_decay: float = 1.0          # multiplicative decay factor used by decay schedules
    lr_decay_start_epoch: int = 0  # epoch after which step/epoch decay starts
    min_lr: float = 0.0            # decay schedules' floor as an absolute LR (0: use min_lr_ratio)
    min_lr_ratio: float = 0.0      # decay schedules' floor as a fraction of learning_rate
    max_grad_norm: float = 0.0     # clip by global norm; 0 disables
    no_decay_bias_norm: bool | None = None   # no weight decay on biases and norm weights (None: adamw only)
    layerwise_lr_decay: float = 1.0  # LR x decay**(depth below the top) per layer (models with parameter_depth)
    freeze_body_steps: int = 0     # the body (all but the model's head_prefixes) is frozen for N steps
    accum_steps: int = 1           # gradient accumulation micro-steps per optimizer step
    max_epochs: int = 0            # 0 = unbounded (use max_steps)
    max_steps: int = 0             # 0 = unbounded (use max_epochs)
    # model (shared shape knobs)
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    filter_size: int = 512         # feed-forward inner size
    dropout: float = 0.0
    init_scale: float = 0.0        # uniform(-s, s) init when > 0, else the module default
    label_smoothing: float = 0.0
    seed: int = 1234

    def replace(self: H, **changes: Any) -> H:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return hparams_to_dict(self)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _convert(key: str, raw: str, typ: Any) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if raw.lower() in ("none", "null"):
            return None
        typ = args[0]
    try:
        if typ is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ is int:
            try:
                return int(raw)
            except ValueError:
                as_float = float(raw)  # accept "1e4" but not "0.5"
                if not as_float.is_integer():
                    raise
                return int(as_float)
        if typ is float:
            return float(raw)
        if typ is str:
            return raw
        if typing.get_origin(typ) is tuple:
            inner = typing.get_args(typ)[0]
            return tuple(_convert(key, part, inner) for part in raw.split(":") if part)
    except ValueError:
        name = getattr(typ, "__name__", str(typ))
        raise HParamsError(f"hparam {key!r}: cannot convert {raw!r} to {name}") from None
    raise HParamsError(f"hparam {key!r}: unsupported type {typ!r}")


_WANTED = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}


def typed_value(key: str, value: Any, typ: Any, what: str = "hparam") -> Any:
    """``value`` (from JSON/YAML or Python, not text) as field ``key`` of type ``typ`` holds it: an
    int for a float field is widened, a list for a tuple field becomes a tuple, ``None`` fits an
    optional field; anything else is an :class:`HParamsError` naming the field."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(typ):
            return None
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    if typing.get_origin(typ) is tuple:
        inner = typing.get_args(typ)[0]
        if isinstance(value, (list, tuple)):
            return tuple(typed_value(key, v, inner, what) for v in value)
        wanted = f"a list of {_WANTED.get(inner, 'values').removeprefix('a ').removeprefix('an ')}s"
    elif typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif typ is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif typ in (bool, str) and isinstance(value, typ):
        return value
    else:
        wanted = _WANTED.get(typ, getattr(typ, "__name__", str(typ)))
    raise HParamsError(f"{what} {key!r} must be {wanted}, got {type(value).__name__} {value!r}")


def parse_overrides(text: str) -> list[tuple[str, str]]:
    """Split ``"lr=0.5,hidden_size=650"`` into ``[("lr", "0.5"), ...]``."""
    pairs = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise HParamsError(f"bad override {item!r}: expected key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        if not key:
            raise HParamsError(f"bad override {item!r}: empty key")
        pairs.append((key, value))
    return pairs


#: former hparams that are Strategy formulation fields (how the math is computed, not what):
#: an override names the flag to use; a checkpoint that still records them loads without them
MOVED_TO_STRATEGY = ("lstm_impl", "lstm_gemm_dtype", "fused_ce", "ce_chunk_rows", "ce_gemm_dtype",
                     "dropout_masks", "clip_via_lr")


def apply_overrides(hp: H, overrides: str | dict[str, Any] | None) -> H:
    """Return ``hp`` with overrides applied; unknown keys and bad types raise HParamsError."""
    if not overrides:
        return hp
    types_ = _field_types(type(hp))
    items = parse_overrides(overrides) if isinstance(overrides, str) else list(overrides.items())
    changes: dict[str, Any] = {}
    for key, value in items:
        if key not in types_ and key in MOVED_TO_STRATEGY and isinstance(hp, HParams):
            raise HParamsError(f"{key} is a Strategy field (how the math is computed, not what): "
                               f"use --strategy-override {key}=...")
        if key not in types_:
            close = difflib.get_close_matches(key, list(types_), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise HParamsError(f"unknown hparam {key!r} for {type(hp).__name__}{hint}")
        changes[key] = (_convert(key, value, types_[key]) if isinstance(value, str)
                        else typed_value(key, value, types_[key]))
    return dataclasses.replace(hp, **changes)


def hparams_to_dict(hp: HParams) -> dict[str, Any]:
    out = dataclasses.asdict(hp)
    out["__class__"] = f"{type(hp).__module__}:{type(hp).__qualname__}"
    return out


def hparams_from_dict(data: dict[str, Any], cls: type[H] | None = None) -> H:
    """Rebuild hparams written by :func:`hparams_to_dict` (class looked up by name, not unpickled).

    The ``"__class__"`` name is resolved by :func:`hotloop.class_lookup.resolve_hparams_class`:
    only classes of hotloop's registries and of ``--import`` modules, never an import the data
    asks for (a class it does not know is an :class:`HParamsError` before any import). Each value
    must have its field's type (:func:`typed_value`: an int widens to a float, a list becomes a
    tuple); a wrong one is an :class:`HParamsError` naming the field.
    """
    if not isinstance(data, dict):
        raise HParamsError(f"hparams must be a mapping of fields, got {type(data).__name__}")
    data = {k: v for k, v in data.items() if k not in MOVED_TO_STRATEGY}
    qual = data.pop("__class__", None)
    if cls is None:
        cls = HParams
        if qual:
            from .class_lookup import resolve_hparams_class
            cls = resolve_hparams_class(qual)
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise HParamsError(f"hparams has fields unknown to {cls.__name__}: {unknown}")
    return cls(**{k: typed_value(k, v, types_[k]) for k, v in data.items()})


def get_hparams(name: str, overrides: str | dict[str, Any] | None = None) -> HParams:
    """Look up a registered set by name and apply overrides."""
    from .registry import hparams_sets
    hp = hparams_sets.get(name)()
    if not isinstance(hp, HParams):
        raise HParamsError(f"hparams set {name!r} returned {type(hp).__name__}, not HParams")
    return apply_overrides(hp, overrides)


def dumps(hp: HParams) -> str:
    return json.dumps(hparams_to_dict(hp), indent=2, sort_keys=True)
