"""Search spaces: ranged hparams read from a YAML or JSON file, checked against the hparams class.

A space file is one mapping from hparams field names to entries::

    learning_rate: {type: float, low: 1e-4, high: 1e-2, log: true}
    num_layers: {type: int, low: 2, high: 6}
    dropout: {type: choice, values: [0.0, 0.1, 0.3]}

A file is data: it is read with YAML's safe loader (or as JSON), never imports anything, and is
checked strictly and typed against the fields of the run's hparams class: an unknown field, a
wrong type, ``low > high``, an empty or repeated choice or an unknown key of an entry is a
:class:`SpaceError` naming the entry. ``float`` entries need a float field, ``int`` entries an
int field; ``choice`` values must have the field's type. ``log`` (positive bounds) and ``step``
are optional for ``float`` and ``int``.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..compose.config import read_user_text
from ..errors import UserError
from ..hparams import HParams, HParamsError, apply_overrides, typed_value

__all__ = ["SpaceError", "Param", "SearchSpace", "load_space", "parse_space", "render_value"]

_KINDS = ("float", "int", "choice")
_KEYS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
         "choice": {"type", "values"}}


class SpaceError(UserError, ValueError):
    """A search-space file that cannot be read, or an entry that does not fit the hparams class."""


@dataclass(frozen=True)
class Param:
    """One searched hparams field: a ``float``/``int`` range or a ``choice`` of typed values."""

    name: str
    kind: str                                  # "float" | "int" | "choice"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    values: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna ``trial`` suggests for this field (typed as the field is)."""
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_categorical(self.name, list(self.values))

    def to_dict(self) -> dict[str, Any]:
        """The entry as a space file writes it."""
        if self.kind == "choice":
            return {"type": "choice", "values": list(self.values)}
        out: dict[str, Any] = {"type": self.kind, "low": self.low, "high": self.high}
        if self.log:
            out["log"] = True
        if self.step is not None:
            out["step"] = self.step
        return out


@dataclass(frozen=True)
class SearchSpace:
    """The searched fields, in file order."""

    params: tuple[Param, ...]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial: Any) -> dict[str, Any]:
        """One point of the space: field -> value, asked of an Optuna ``trial``."""
        return {p.name: p.suggest(trial) for p in self.params}

    def to_dict(self) -> dict[str, Any]:
        return {p.name: p.to_dict() for p in self.params}


def render_value(value: Any) -> str:
    """``value`` as ``--override`` text that converts back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# YAML 1.1 reads ``1e-4`` (no dot) as a string; a space file means a number there
_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def _yaml_loader() -> Any:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """Safe loading, ``1e-4`` as a float, and a repeated key as an error."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
            repeated = sorted({str(k) for k in keys if keys.count(k) > 1})
            if repeated:
                raise SpaceError(f"key {repeated[0]!r} appears twice")
            return super().construct_mapping(node, deep=deep)

    StrictLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return StrictLoader


def _read(path: Path) -> Any:
    text = read_user_text(path, "search space", SpaceError)
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise SpaceError(f"search space {path}: not valid JSON: {exc}") from None
    import yaml
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except SpaceError as exc:
        raise SpaceError(f"search space {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise SpaceError(f"search space {path}: not valid YAML: {' '.join(str(exc).split())}") from None


def load_space(path: str | Path, hp: HParams) -> SearchSpace:
    """The space of file ``path`` (``.json``, else YAML), checked against ``hp``'s class."""
    path = Path(path)
    return parse_space(_read(path), hp, source=f"search space {path}")


def _field_types(hp: HParams) -> dict[str, Any]:
    hints = typing.get_type_hints(type(hp))
    return {f.name: hints[f.name] for f in dataclasses.fields(hp)}


def parse_space(data: Any, hp: HParams, source: str = "search space") -> SearchSpace:
    """A checked :class:`SearchSpace` from ``data`` (the file's mapping) for hparams like ``hp``."""
    if not isinstance(data, Mapping) or not data:
        got = "an empty mapping" if isinstance(data, Mapping) else type(data).__name__
        raise SpaceError(f"{source}: expected a mapping of hparams fields to entries, got {got}")
    types_ = _field_types(hp)
    params = []
    for name, entry in data.items():
        where = f"{source}: entry {name!r}"
        if name not in types_:
            close = difflib.get_close_matches(str(name), list(types_), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SpaceError(f"{where}: {type(hp).__name__} has no field {name!r}{hint}")
        params.append(_param(str(name), entry, types_[name], hp, where))
    return SearchSpace(tuple(params))


def _param(name: str, entry: Any, typ: Any, hp: HParams, where: str) -> Param:
    if not isinstance(entry, Mapping):
        raise SpaceError(f"{where}: expected a mapping like {{type: float, low: ..., high: ...}}, "
                         f"got {type(entry).__name__} {entry!r}")
    kind = entry.get("type")
    if kind not in _KINDS:
        raise SpaceError(f"{where}: 'type' must be one of {', '.join(_KINDS)}, got {kind!r}")
    unknown = sorted(set(map(str, entry)) - _KEYS[kind])
    if unknown:
        raise SpaceError(f"{where}: unknown key {unknown[0]!r} for type {kind} "
                         f"(keys: {', '.join(sorted(_KEYS[kind]))})")
    if kind == "choice":
        return _choice(name, entry, typ, hp, where)
    field_type = {"float": float, "int": int}[kind]
    if typ is not field_type:
        actual = getattr(typ, "__name__", str(typ))
        other = actual if actual in ("int", "float") else "choice"
        raise SpaceError(f"{where}: type {kind} needs a {kind} field, but {name} is {actual}; use type: {other}")
    missing = [k for k in ("low", "high") if k not in entry]
    if missing:
        raise SpaceError(f"{where}: type {kind} needs {' and '.join(missing)}")
    low, high = (_number(entry[k], kind, f"{where}: {k!r}") for k in ("low", "high"))
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: 'log' must be true or false, got {log!r}")
    step = entry.get("step")
    if step is not None:
        step = _number(step, kind, f"{where}: 'step'")
        if step <= 0:
            raise SpaceError(f"{where}: 'step' must be > 0, got {step!r}")
        if log:
            raise SpaceError(f"{where}: 'step' and 'log: true' cannot be combined")
    if low > high:
        raise SpaceError(f"{where}: low {low!r} > high {high!r}")
    if log and low <= 0:
        raise SpaceError(f"{where}: 'log: true' needs low > 0, got {low!r}")
    return Param(name, kind, low, high, log, step)


def _number(value: Any, kind: str, where: str) -> float | int:
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise SpaceError(f"{where} must be an integer, got {type(value).__name__} {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise SpaceError(f"{where} must be a finite number, got {type(value).__name__} {value!r}")


def _choice(name: str, entry: Mapping[str, Any], typ: Any, hp: HParams, where: str) -> Param:
    values = entry.get("values")
    if not isinstance(values, list) or not values:
        raise SpaceError(f"{where}: type choice needs 'values', a non-empty list, got {values!r}")
    typed = []
    for value in values:
        if isinstance(value, (list, dict)) or typing.get_origin(typ) is tuple:
            raise SpaceError(f"{where}: choice values must be single numbers, strings or true/false, "
                             f"got {value!r}")
        try:
            v = typed_value(name, value, typ, what="choice of")
        except HParamsError as exc:
            raise SpaceError(f"{where}: {exc}") from None
        if v in typed:
            raise SpaceError(f"{where}: value {value!r} appears twice")
        _check_text_round_trip(name, v, hp, where)
        typed.append(v)
    return Param(name, "choice", values=tuple(typed))


def _check_text_round_trip(name: str, value: Any, hp: HParams, where: str) -> None:
    """A trial gets its values as ``--override`` text; refuse one that text cannot carry."""
    text = render_value(value)
    try:
        ok = "," not in text and getattr(apply_overrides(hp, {name: text}), name) == value
    except HParamsError:
        ok = False
    if not ok:
        raise SpaceError(f"{where}: value {value!r} cannot be passed as an override "
                         f"(no commas or surrounding spaces)")
