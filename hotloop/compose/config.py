"""Run configuration files for ``hotloop train --config FILE`` (JSON always, YAML with PyYAML).

A config file is one mapping whose keys are the ``hotloop train`` settings
(:data:`CONFIG_KEYS`); the ``run.json`` a finished run leaves in its output
directory is such a file too (its extra informational keys, e.g. ``torch``, are
ignored), so ``hotloop train --config D/run.json --output-dir D2`` repeats run D.

``imports`` may only repeat modules the command line's ``--import`` already
imported: a file never chooses code to run (the error names the flags to add).

Flags given on the command line win over the file, except ``overrides`` and
``strategy_overrides``, which are combined: the file's first, then the flags'
(a key in both takes the flag's value).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import UserError
from ..hparams import parse_overrides

__all__ = ["ConfigError", "read_user_text", "CONFIG_KEYS", "ALIASES", "IGNORED_KEYS", "LEAST_VALUES", "load_config", "hparams_changes",
           "check_counts"]


class ConfigError(UserError, ValueError):
    """A config file that cannot be read or has an unknown key or a value of the wrong type, or a
    ``hotloop train`` count or limit (flag or config key) out of range."""


_STR, _INT, _NUM, _BOOL = (str,), (int,), (int, float), (bool,)
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
_OPT_NUM = (int, float, type(None))

#: key -> accepted JSON types (``dict`` for overrides means ``{"key": value}``)
CONFIG_KEYS: dict[str, tuple[type, ...]] = {
    "problem": _STR, "model": _STR, "hparams": _OPT_STR, "overrides": (str, dict, type(None)),
    "strategy": (str, dict), "strategy_overrides": (str, dict, type(None)), "device": _STR,
    "precision": _OPT_STR, "accum_steps": _OPT_INT,
    "max_steps": _OPT_INT, "max_epochs": _OPT_INT, "max_time": _OPT_NUM, "eval_every": _INT,
    "keep_last": _INT, "output_dir": _OPT_STR, "data_dir": _OPT_STR, "raw_dir": _OPT_STR, "raw_root": _OPT_STR,
    "imports": (list,), "loggers": (str, list), "on_nonfinite": _STR, "resume": _BOOL, "eval_bleu": _INT,
    "init_from": _OPT_STR, "init_strict": _BOOL, "init_hparams_from_config": _BOOL,
    "monitor": _OPT_STR, "mode": _STR, "early_stop": _INT, "early_stop_min_delta": _NUM,
}
#: other spellings accepted (``run.json`` writes ``hparams_set``)
ALIASES = {"hparams_set": "hparams", "strategy_override": "strategy_overrides", "override": "overrides",
           "import": "imports"}
#: keys that ``run.json`` records for information only (``data_root``: ``HOTLOOP_DATA_DIR`` then)
IGNORED_KEYS = ("torch", "data_root")
#: counts of ``hotloop train`` (a flag or a config key) -> the least value they take
LEAST_VALUES = {"keep_last": 1, "eval_every": 0, "max_steps": 0, "max_epochs": 0}


def _type_names(types: tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "true/false", dict: "mapping",
             list: "list", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def read_user_text(path: Path, what: str, error: type[UserError]) -> str:
    """``path``'s UTF-8 text, or ``error("<what> <path>: cannot read it (<reason>)")``."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise error(f"{what} {path}: cannot read it ({reason})") from None


def _parse(path: Path) -> Any:
    text = read_user_text(path, "config file", ConfigError)
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"config file {path}: reading YAML needs PyYAML "
                              "(pip install pyyaml), or write the config as JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"config file {path}: not valid JSON: {exc}") from None


def _check_imports(path: Path, specs: list[str]) -> None:
    """A config file may repeat ``--import`` modules, not add any: a file cannot choose code to run."""
    from ..registry import is_imported
    missing = [spec for spec in specs if not is_imported(spec)]
    if missing:
        flags = " ".join(f"--import {spec}" for spec in missing)
        raise ConfigError(f"config file {path}: 'imports' names {', '.join(missing)}, which the command line "
                          f"did not import; a file cannot choose code to run: if you trust it, pass {flags}")


def load_config(path: str | Path) -> dict[str, Any]:
    """The checked settings of config file ``path`` (aliases resolved, informational keys dropped)."""
    path = Path(path)
    data = _parse(path)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = ALIASES.get(str(raw_key), str(raw_key))
        if key in IGNORED_KEYS:
            continue
        if key not in CONFIG_KEYS:
            raise ConfigError(f"config file {path}: unknown key {raw_key!r}; known keys: "
                              f"{', '.join(sorted(CONFIG_KEYS))}")
        types = CONFIG_KEYS[key]
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            raise ConfigError(f"config file {path}: {raw_key!r} must be {_type_names(types)}, "
                              f"got {type(value).__name__} {value!r}")
        if key in ("imports", "loggers") and isinstance(value, list) and \
                not all(isinstance(v, str) for v in value):
            raise ConfigError(f"config file {path}: {raw_key!r} must be a list of strings, got {value!r}")
        if key == "imports":
            _check_imports(path, value)
        out[key] = value
    return out


def hparams_changes(*parts: str | dict[str, Any] | None) -> dict[str, Any]:
    """One mapping of hparams changes from override mappings (typed values kept) and ``"k=v,..."``
    text (split once; its values stay text for the hparams class to convert), later keys winning."""
    changes: dict[str, Any] = {}
    for part in parts:
        if isinstance(part, dict):
            changes.update(part)
        elif part:
            changes.update(parse_overrides(part))
    return changes


def check_counts(settings: Mapping[str, Any]) -> None:
    """The counts and the time limit of ``hotloop train`` settings (flags or a config file, None
    when not given) are in range: :data:`LEAST_VALUES`, and ``max_time`` > 0 seconds."""
    for key, least in LEAST_VALUES.items():
        value = settings.get(key)
        if value is not None and value < least:
            raise ConfigError(f"{key} (--{key.replace('_', '-')}) must be >= {least}, got {value}")
    max_time = settings.get("max_time")
    if max_time is not None and not max_time > 0:
        raise ConfigError(f"max_time (--max-time) must be > 0 seconds, got {max_time}")
