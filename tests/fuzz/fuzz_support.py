"""What the fuzz tests share: a fixed example budget, byte and JSON mutations, the one property.

The property every parser and loader must keep (:func:`result_or_user_error`): an input gives
a result or a :class:`~hotloop.errors.UserError` whose message is one line; any other
exception fails the test (hypothesis shrinks it and prints the input). :func:`tree_digest`
hashes a directory before and after, so a test also shows no earlier file changed.

Hypothesis runs derandomized (the same examples on every run, as CI needs) with no example
database and no deadline (the machine is shared); each test sets its own ``max_examples``.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hotloop.errors import UserError

__all__ = ["fuzz_settings", "result_or_user_error", "tree_digest", "content_digests", "byte_mutation",
           "apply_byte_mutation", "json_values", "json_edit", "field_edit", "apply_json_edit", "json_paths", "dumps",
           "ODD_INTS"]

T = TypeVar("T")

#: integers that break naive code (sizes of 0 or -1, values past int64) but allocate nothing big
ODD_INTS = (-(2 ** 63), -1, 0, 1, 2, 3, 7, 2 ** 62, 2 ** 64)


def fuzz_settings(max_examples: int) -> settings:
    """A fixed, reproducible example budget: derandomized, no database, no deadline."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


def result_or_user_error(call: Callable[[], T], *inputs: Any) -> T | UserError:
    """``call()``'s result, or the :class:`UserError` it raised, checked to be a non-empty message
    of one line (unless one of ``inputs``, the text the message may quote, holds a line break:
    the CLI prints any message on one line).

    Any other exception propagates: that input is a bug in the parser or loader under test.
    """
    try:
        return call()
    except UserError as exc:
        message = str(exc)
        assert message.strip(), f"{type(exc).__name__} with an empty message"
        if not any(ch in text for text in _texts(inputs) for ch in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
            assert len(message.strip().splitlines()) == 1, f"{type(exc).__name__} message is not one line: {message!r}"
        assert "Traceback" not in message, message
        return exc


def _texts(value: Any) -> list[str]:
    """Every string inside ``value`` (nested mappings and lists included; other values as ``str``)."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _texts(k) + _texts(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _texts(v)]
    return [value if isinstance(value, str) else str(value)]


def tree_digest(root: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``root``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def content_digests(root: Path) -> list[str]:
    """The sorted sha256s of every file under ``root`` (a file moved aside keeps its bytes)."""
    return sorted(tree_digest(root).values())


# ------------------------------------------------------------------ byte mutations

@st.composite
def byte_mutation(draw: Any) -> tuple[str, int, int]:
    """``(kind, where, amount)``: flip bits, truncate, extend, or overwrite a run of bytes."""
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "overwrite"]))
    return kind, draw(st.integers(0, 2 ** 31)), draw(st.integers(1, 64))


def apply_byte_mutation(data: bytes, mutation: tuple[str, int, int]) -> bytes:
    """``data`` changed by ``mutation`` (positions wrap around the length)."""
    kind, where, amount = mutation
    if not data:
        return bytes(amount)
    pos = where % len(data)
    if kind == "flip":
        out = bytearray(data)
        for i in range(amount % 8 + 1):
            out[(pos + i * 7919) % len(out)] ^= 1 << ((where + i) % 8)
        return bytes(out)
    if kind == "truncate":
        return data[:pos]
    if kind == "extend":
        return data + bytes((where + i) % 256 for i in range(amount))
    return data[:pos] + bytes((where * 31 + i) % 256 for i in range(amount)) + data[pos + amount:]


# ------------------------------------------------------------------ JSON edits

_SCALARS = st.one_of(st.none(), st.booleans(), st.sampled_from(ODD_INTS), st.integers(-10, 10),
                     st.sampled_from([0.0, -1.5, 0.5, 1e308, math.inf, -math.inf, math.nan]),
                     st.sampled_from(["", "x", "auto", "none", "fp16", "transformer", "algorithmic_reverse",
                                      "../escape", "module:Name", "hotloop.hparams:HParams", "os:system",
                                      "\u00e9\n\x00"]))


def json_values(depth: int = 2) -> st.SearchStrategy[Any]:
    """JSON-like values (inf/NaN included, as Python's json writes them), nested ``depth`` deep."""
    return st.recursive(_SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "step", "model", "hparams", "x"]),
                                                     inner, max_size=3)), max_leaves=4 if depth else 1)


def json_paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys / indices) to a value inside ``data``, the root included."""
    paths = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            paths.extend(json_paths(value, prefix + (key,)))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            paths.extend(json_paths(value, prefix + (index,)))
    return paths


@st.composite
def json_edit(draw: Any) -> tuple[str, int, Any, str]:
    """``(kind, which path, new value, new key)``: replace, delete, add a key, or wrap a value."""
    return (draw(st.sampled_from(["replace", "delete", "add", "wrap"])), draw(st.integers(0, 2 ** 31)),
            draw(json_values()), draw(st.sampled_from(["extra", "__class__", "format", "version", "step"])))


def field_edit(keys: list[str]) -> st.SearchStrategy[tuple[str, int, Any, str]]:
    """Edits that set one top-level field (one of ``keys``) to an odd value: a known key is likelier
    to pass the first checks than a random path."""
    values = st.one_of(st.sampled_from(ODD_INTS), st.integers(-3, 3), st.booleans(), json_values())
    return st.tuples(st.just("set"), st.just(0), values, st.sampled_from(keys))


def apply_json_edit(data: Any, edit: tuple[str, int, Any, str]) -> Any:
    """A copy of ``data`` with one value at a chosen path edited (the root may be replaced)."""
    kind, which, value, key = edit
    data = copy.deepcopy(data)
    if kind == "set" and isinstance(data, dict):
        data[key] = value
        return data
    paths = json_paths(data)
    path = paths[which % len(paths)]
    if not path:
        return {key: value} if kind == "add" else ([data] if kind == "wrap" else value)
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if kind == "replace":
        parent[last] = value
    elif kind == "delete":
        del parent[last]
    elif kind == "wrap":
        parent[last] = [parent[last]]
    elif isinstance(parent[last], dict):
        parent[last][key] = value
    else:
        parent[last] = {key: value}
    return data


def dumps(data: Any) -> str:
    """JSON text as Python writes it (``NaN``/``Infinity`` allowed, as a hand-edited file may hold)."""
    return json.dumps(data)
