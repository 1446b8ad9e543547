"""Fuzzed text a user types or writes: ``--override``, ``--strategy-override``, strategy files, config files.

Each input gives a result or a one-line :class:`~hotloop.errors.UserError`, never another
exception; files read are left as they were; and from the command line a bad override or
config file exits 2 with one line on stderr and no traceback.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml
from fuzz_support import (apply_json_edit, dumps, field_edit, fuzz_settings, json_edit, json_values,
                          result_or_user_error, tree_digest)
from hypothesis import example, given
from hypothesis import strategies as st

from hotloop.cli import build_parser
from hotloop.cli import train as train_cli
from hotloop.cli.common import resolve_device
from hotloop.compose.build import resolve_names
from hotloop.compose.config import CONFIG_KEYS, load_config
from hotloop.compose.plan import StrategyRequest
from hotloop.engine.strategy import Strategy
from hotloop.hparams import HParams, apply_overrides, get_hparams
from hotloop.train.checkpoint import CheckpointManager
from hotloop.train.tracking import parse_logger_names

pytestmark = pytest.mark.timeout(240)

#: hparams sets with tuple, bool, str and checked (``train_fraction``) fields
HPARAMS = [get_hparams(name) for name in ("transformer_algorithmic", "conv_net_base", "deeplabv3plus_r50",
                                          "lstm_seq2seq_multi30k")]
_HP_KEYS = sorted({f.name for hp in HPARAMS for f in dataclasses.fields(hp)})
_STRATEGY_KEYS = [f.name for f in dataclasses.fields(Strategy)]
_VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "-1", "2.5", "1e4", "1e400", "nan", "inf", "-inf", "true", "off", "none",
                     "null", "1:2:3", "1::x", ":", "fp16", "bf16", "graph", "eager", "auto", "adam", "=", "0x10",
                     "9" * 30, "1_000", " 3 ", "\u0663", "\x00"]),
    st.text(max_size=8))
_KEYS = st.one_of(st.sampled_from(_HP_KEYS + _STRATEGY_KEYS + ["lstm_impl", "", " ", "a b", "__class__"]),
                  st.text(max_size=6))


@st.composite
def override_text(draw, keys=_KEYS):
    """``"k=v,k=v"`` text, with the odd missing ``=``, empty item or stray separator."""
    items = draw(st.lists(st.tuples(keys, _VALUES, st.sampled_from(["=", "", "==", " = "])), max_size=4))
    glue = draw(st.sampled_from([",", ", ", ",,"]))
    return glue.join(f"{k}{sep}{v}" for k, sep, v in items)


@fuzz_settings(300)
@given(text=override_text(), which=st.integers(0, len(HPARAMS) - 1))
def test_hparams_overrides(text, which):
    hp = HPARAMS[which]
    out = result_or_user_error(lambda: apply_overrides(hp, text), text)
    if isinstance(out, HParams):
        assert type(out) is type(hp)
        for f in dataclasses.fields(hp):
            default = getattr(hp, f.name)
            assert type(getattr(out, f.name)) is type(default) or default is None, f.name


@fuzz_settings(300)
@given(text=override_text(st.one_of(st.sampled_from(_STRATEGY_KEYS), _KEYS)))
def test_strategy_overrides_and_requests(text):
    changes = result_or_user_error(lambda: Strategy.parse_overrides(text), text)
    if isinstance(changes, dict):
        strategy = Strategy().replace(**changes)
        assert Strategy.from_mapping(strategy.to_dict()) == strategy     # every value typed
    result_or_user_error(lambda: StrategyRequest.parse("auto", text, "cpu"), text)
    result_or_user_error(lambda: StrategyRequest.parse("default", text, "cpu"), text)


_VALID_STRATEGY = Strategy(backend="graph", graph_passes=True, disabled_passes=("fuse_cross_entropy",),
                           intra_op_threads=2, bucket_mb=12.5).to_dict()


@fuzz_settings(250)
@given(edit=st.one_of(json_edit(), field_edit(_STRATEGY_KEYS)).map(lambda e: ("edit", e))
       | json_values().map(lambda v: ("whole", v)),
       raw=st.one_of(st.none(), st.binary(max_size=24)))
def test_strategy_files(tmp_path_factory, edit, raw):
    root = tmp_path_factory.mktemp("strategy")
    path, data = root / "strategy.json", None
    if raw is not None:
        path.write_bytes(raw)
    else:
        kind, what = edit
        data = apply_json_edit(_VALID_STRATEGY, what) if kind == "edit" else what
        path.write_text(dumps(data))
    before, text = tree_digest(root), (path.read_bytes().decode("utf-8", "replace"), data)
    out = result_or_user_error(lambda: Strategy.from_file(path), text)
    if isinstance(out, Strategy):
        assert Strategy.from_mapping(out.to_dict()) == out
    result_or_user_error(lambda: StrategyRequest.parse(str(path), None, "cpu"), text)
    assert tree_digest(root) == before


_VALID_CONFIG = {"problem": "algorithmic_reverse", "model": "transformer", "hparams": "transformer_algorithmic",
                 "overrides": {"hidden_size": 16, "num_layers": 1}, "strategy": {"prefetch": 0},
                 "strategy_overrides": "sync_every=5", "max_steps": 3, "eval_every": 2, "keep_last": 1,
                 "loggers": ["jsonl"], "on_nonfinite": "skip", "device": "cpu", "precision": None,
                 "accum_steps": 1, "imports": [], "resume": False, "torch": "2.13.0"}


def _train_front_half(path) -> tuple:
    """What ``hotloop train --config path`` decides before it builds anything: settings, names,
    hparams, the Strategy request and the loggers (everything a config file chooses)."""
    argv = ["--config", str(path)]
    args = build_parser(only="train").parse_args(["train", *argv])
    args.command_argv = argv                      # as hotloop.cli.main records it
    args.device = resolve_device(args.device)
    train_cli.apply_config(args)
    overrides = dict(args.hparams_changes)
    for key in ("max_steps", "max_epochs"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    names = resolve_names(args.problem, args.model, args.hparams, overrides)
    request = train_cli.strategy_request(args)
    parse_logger_names(args.loggers)
    CheckpointManager(path.parent / "never-written", keep_last=args.keep_last, writer=False)
    return names, request


@fuzz_settings(300)
@given(edit=st.one_of(json_edit(), field_edit(sorted(CONFIG_KEYS))).map(lambda e: ("edit", e))
       | json_values().map(lambda v: ("whole", v)),
       suffix=st.sampled_from([".json", ".yaml"]), raw=st.one_of(st.none(), st.binary(max_size=24),
                                                                 st.text(max_size=40)))
@example(edit=("edit", ("set", 0, 0, "keep_last")), suffix=".json", raw=None)               # found by fuzzing
@example(edit=("edit", ("set", 0, "\u00e9\n\x00", "strategy")), suffix=".json", raw=None)
def test_config_files(tmp_path_factory, edit, suffix, raw):
    root = tmp_path_factory.mktemp("config")
    path = root / f"run{suffix}"
    data = None
    if isinstance(raw, bytes):
        path.write_bytes(raw)
    elif isinstance(raw, str):
        path.write_text(raw)
    else:
        kind, what = edit
        data = apply_json_edit(_VALID_CONFIG, what) if kind == "edit" else what
        path.write_text(yaml.safe_dump(data) if suffix == ".yaml" else dumps(data))
    before, text = tree_digest(root), path.read_bytes().decode("utf-8", "replace")
    config = result_or_user_error(lambda: load_config(path), text, data)
    if isinstance(config, dict):
        result_or_user_error(lambda: _train_front_half(path), text, data)
    assert tree_digest(root) == before


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotloop", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["override", "config"])
def test_cli_exits_2_with_one_line_for_a_bad_override_or_config(tmp_path, case):
    if case == "override":
        argv = ["train", "--override", "hidden_size=1e400,num_layers", "--output-dir", str(tmp_path / "r")]
    else:
        config = tmp_path / "run.json"
        config.write_text(json.dumps({**_VALID_CONFIG, "overrides": {"hidden_size": [1, {"x": None}]}}))
        argv = ["train", "--config", str(config), "--output-dir", str(tmp_path / "r")]
    proc = _cli(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hotloop: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()
