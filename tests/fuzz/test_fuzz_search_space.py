"""Fuzzed search-space files (``hotloop search --space``): a checked space or one ``UserError`` line.

Edits of a valid space (entries replaced, deleted, wrapped; odd bounds, types and choice lists)
go through :func:`parse_space`, and mutated bytes of the YAML / JSON file through
:func:`load_space`. A space that parses must also give, for every field, a value of the field's
type inside its bounds when Optuna's ``FixedTrial`` asks for its low end; no file changes.
"""
from __future__ import annotations

import json
from pathlib import Path

import optuna
from hypothesis import example, given
from hypothesis import strategies as st

from hotloop.compose.build import resolve_names
from hotloop.search.space import SearchSpace, load_space, parse_space

from fuzz_support import (apply_byte_mutation, apply_json_edit, byte_mutation, field_edit, fuzz_settings, json_edit,
                          result_or_user_error, tree_digest)

VALID = {"learning_rate": {"type": "float", "low": 1e-4, "high": 3e-2, "log": True},
         "hidden_size": {"type": "int", "low": 8, "high": 32, "step": 8},
         "dropout": {"type": "choice", "values": [0.0, 0.1, 0.3]}}
HP = resolve_names("algorithmic_reverse", "transformer", None, {})[3]
ENTRY_KEYS = ["type", "low", "high", "log", "step", "values"]


def _check_parsed(space: SearchSpace) -> None:
    """Each parsed field asks Optuna for a value in range (the low end of a range, the first choice)."""
    for param in space.params:
        fixed = {param.name: param.low if param.kind != "choice" else param.values[0]}
        value = param.suggest(optuna.trial.FixedTrial(fixed))
        if param.kind == "choice":
            assert value in param.values
        else:
            assert param.low <= value <= param.high, (param, value)
            assert isinstance(value, type(getattr(HP, param.name))), (param, value)


@fuzz_settings(300)
@given(edit=st.one_of(json_edit(), field_edit(list(VALID))),
       entry_edit=st.one_of(st.none(), field_edit(ENTRY_KEYS)))
@example(edit=("set", 0, {"type": "float", "low": 1.0, "high": 0.5}, "learning_rate"), entry_edit=None)
@example(edit=("set", 0, {"type": "int", "low": 8, "high": 32, "step": 0}, "hidden_size"), entry_edit=None)
@example(edit=("set", 0, {"type": "choice", "values": []}, "dropout"), entry_edit=None)
@example(edit=("set", 0, {"type": "float", "low": 0.0, "high": 1.0, "log": True}, "learning_rate"), entry_edit=None)
def test_space_entries(edit, entry_edit) -> None:
    data = apply_json_edit(VALID, edit)
    if entry_edit is not None and isinstance(data, dict) and data:
        name = sorted(data, key=str)[0]
        data[name] = apply_json_edit(data[name], entry_edit)
    result = result_or_user_error(lambda: parse_space(data, HP), data)
    if isinstance(result, SearchSpace):
        _check_parsed(result)


@fuzz_settings(150)
@given(mutation=byte_mutation(), suffix=st.sampled_from([".yaml", ".json"]))
def test_space_files(tmp_path_factory, mutation, suffix) -> None:
    folder: Path = tmp_path_factory.mktemp("space")
    text = json.dumps(VALID) if suffix == ".json" else Path("examples/search_space.yaml").read_text()
    path = folder / f"space{suffix}"
    path.write_bytes(apply_byte_mutation(text.encode(), mutation))
    before = tree_digest(folder)
    result = result_or_user_error(lambda: load_space(path, HP), path.read_bytes().decode("utf-8", "replace"))
    if isinstance(result, SearchSpace):
        _check_parsed(result)
    assert tree_digest(folder) == before
