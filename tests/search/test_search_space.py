"""Search-space files: typed against the hparams class, every bad entry a one-line SpaceError."""
from __future__ import annotations

import argparse

import pytest

from hotloop.hparams import get_hparams
from hotloop.search.space import SpaceError, load_space, parse_space, render_value

HP = get_hparams("mlp_algorithmic")


def _load(tmp_path, text, suffix=".yaml"):
    path = tmp_path / f"space{suffix}"
    path.write_text(text)
    return load_space(path, HP)


def test_the_documented_entries_parse_typed(tmp_path):
    space = _load(tmp_path, "learning_rate: {type: float, low: 1e-4, high: 1e-2, log: true}\n"
                            "num_layers: {type: int, low: 2, high: 6}\n"
                            "dropout: {type: choice, values: [0, 0.1, 0.3]}\n"
                            "hidden_size: {type: int, low: 8, high: 32, step: 8}\n"
                            "optimizer: {type: choice, values: [adam, sgd]}\n")
    lr, layers, dropout, hidden, opt = space.params
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 1e-4, 1e-2, True)
    assert isinstance(lr.low, float) and isinstance(layers.low, int)
    assert (layers.kind, layers.low, layers.high, layers.log) == ("int", 2, 6, False)
    assert dropout.values == (0.0, 0.1, 0.3) and all(isinstance(v, float) for v in dropout.values)
    assert hidden.step == 8 and opt.values == ("adam", "sgd")
    assert space.names == ["learning_rate", "num_layers", "dropout", "hidden_size", "optimizer"]


def test_json_space_and_round_trip_of_to_dict(tmp_path):
    space = _load(tmp_path, '{"learning_rate": {"type": "float", "low": 0.001, "high": 0.1}}', ".json")
    assert parse_space(space.to_dict(), HP) == space


@pytest.mark.parametrize("text, words", [
    ("num_layer: {type: int, low: 2, high: 6}", ["'num_layer'", "no field", "did you mean 'num_layers'"]),
    ("num_layers: {type: float, low: 2, high: 6}", ["'num_layers'", "needs a float field", "use type: int"]),
    ("learning_rate: {type: int, low: 1, high: 6}", ["'learning_rate'", "needs a int field", "use type: float"]),
    ("optimizer: {type: float, low: 1, high: 6}", ["'optimizer'", "use type: choice"]),
    ("learning_rate: {type: float, low: 0.1, high: 0.01}", ["'learning_rate'", "low 0.1 > high 0.01"]),
    ("num_layers: {type: int, low: 6, high: 2}", ["'num_layers'", "low 6 > high 2"]),
    ("dropout: {type: choice, values: []}", ["'dropout'", "non-empty list"]),
    ("dropout: {type: choice}", ["'dropout'", "non-empty list"]),
    ("dropout: {type: choice, values: [0.1, 0.1]}", ["'dropout'", "appears twice"]),
    ("dropout: {type: choice, values: [0.1, fast]}", ["'dropout'", "must be a number", "'fast'"]),
    ("num_layers: {type: choice, values: [2, 2.5]}", ["'num_layers'", "must be an integer"]),
    ("optimizer: {type: choice, values: ['a,b']}", ["'optimizer'", "cannot be passed as an override"]),
    ("num_layers: {type: int, low: 2.5, high: 6}", ["'num_layers'", "'low' must be an integer"]),
    ("learning_rate: {type: float, low: x, high: 1}", ["'learning_rate'", "'low' must be a finite number"]),
    ("learning_rate: {type: float, high: 1}", ["'learning_rate'", "needs low"]),
    ("learning_rate: {type: float, low: 0, high: 1, log: true}", ["'learning_rate'", "needs low > 0"]),
    ("learning_rate: {type: float, low: 0.1, high: 1, log: yes please}", ["'log' must be true or false"]),
    ("learning_rate: {type: float, low: 0.1, high: 1, step: 0}", ["'step' must be > 0"]),
    ("learning_rate: {type: float, low: 0.1, high: 1, step: 0.1, log: true}", ["cannot be combined"]),
    ("num_layers: {type: int, low: 2, high: 6, lo: 3}", ["'num_layers'", "unknown key 'lo'"]),
    ("num_layers: {type: integer, low: 2, high: 6}", ["'num_layers'", "'type' must be one of"]),
    ("num_layers: 4", ["'num_layers'", "expected a mapping"]),
    ("num_layers: {type: int, low: 2, high: 6}\nnum_layers: {type: int, low: 1, high: 2}", ["appears twice"]),
    ("- 1\n- 2", ["expected a mapping", "list"]),
    ("", ["expected a mapping", "NoneType"]),
    ("{}", ["expected a mapping", "an empty mapping"]),
    ("a: [", ["not valid YAML"]),
    ("!!python/object/apply:os.system ['true']", ["not valid YAML"]),
])
def test_a_bad_entry_is_one_line_naming_it(tmp_path, text, words):
    with pytest.raises(SpaceError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message and message.startswith("search space ")
    for word in words:
        assert word in message


def test_unreadable_file_and_bad_json(tmp_path):
    with pytest.raises(SpaceError, match="cannot read it"):
        load_space(tmp_path / "missing.yaml", HP)
    with pytest.raises(SpaceError, match="not valid JSON"):
        _load(tmp_path, "{learning_rate: 1}", ".json")


@pytest.mark.parametrize("value", [1e-5, 0.1, 3.0000000000000004e-4, 7, True, False, "sgd"])
def test_rendered_values_convert_back(value):
    from hotloop.hparams import apply_overrides
    field = {float: "learning_rate", int: "num_layers", bool: "init_scale", str: "optimizer"}[type(value)]
    if isinstance(value, bool):
        assert render_value(value) == ("true" if value else "false")
        return
    assert getattr(apply_overrides(HP, {field: render_value(value)}), field) == value


def test_trial_command_line_passes_the_search_flags_on(tmp_path):
    from hotloop.cli import build_parser
    from hotloop.cli.search import trial_argv
    args = build_parser(only="search").parse_args(
        ["search", "--space", "s.yaml", "--trials", "3", "--output-dir", "D", "--problem", "algorithmic_reverse",
         "--model", "mlp", "--hparams", "mlp_algorithmic", "--override", "batch_size=8", "--eval-every", "5",
         "--max-steps", "20", "--loggers", "jsonl", "--precision", "bf16", "--on-nonfinite", "skip",
         "--jobs", "2", "--metric", "loss", "--device", "cpu"])
    argv = trial_argv(args, {"learning_rate": 0.001, "num_layers": 3}, tmp_path / "D" / "trial_0002",
                      tmp_path / "D" / "strategy.json")
    text = " ".join(argv)
    assert argv[0] == "train" and "--override batch_size=8,learning_rate=0.001,num_layers=3" in text
    for flag in ("--eval-every 5", "--max-steps 20", "--loggers jsonl", "--on-nonfinite skip",
                 "--hparams mlp_algorithmic", f"--strategy {tmp_path / 'D' / 'strategy.json'}",
                 f"--output-dir {tmp_path / 'D' / 'trial_0002'}"):
        assert flag in text
    from hotloop.cli.search import train_option_strings
    if {"--monitor", "--mode"} <= train_option_strings():   # each trial's best checkpoint: the searched metric
        assert "--monitor loss --mode min" in text
    for search_only in ("--trials", "--jobs", "--space", "--metric", "--precision", "--output-dir D "):
        assert search_only not in text + " "
    assert isinstance(build_parser(only="train").parse_args(argv), argparse.Namespace)
