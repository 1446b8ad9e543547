"""Fuzzed checkpoints and checkpoint manifests: bit flips, truncation, extension, edited metadata.

A real two-step run's checkpoint is mutated (its bytes, its manifest's JSON, or its metadata and
entries re-saved with a manifest that matches) and read the ways hotloop reads one: the loader,
``eval``/``decode``/``export``'s :func:`~hotloop.compose.restore.load_trained`, the run-directory
lookup (which moves a damaged file aside) and ``--resume``. Each gives a result or a one-line
:class:`~hotloop.errors.UserError`; no file's bytes change (a damaged file is only renamed).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import typing

import pytest
import torch
from fuzz_support import (apply_byte_mutation, apply_json_edit, byte_mutation, content_digests, field_edit,
                          fuzz_settings, json_edit, json_values, result_or_user_error, tree_digest)
from helpers import make_trainer, tiny_hp
from hypothesis import example, given
from hypothesis import strategies as st

from hotloop import cli
from hotloop.compose.restore import find_checkpoint, load_trained
from hotloop.hparams import typed_value
from hotloop.train.checkpoint import load_checkpoint
from hotloop.train.manifest import manifest_path, write_manifest

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore:enable_nested_tensor")]
TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2")
_HP_KEYS = ["hidden_size", "num_heads", "num_layers", "filter_size", "dropout", "batch_size", "seed",
            "num_symbols", "optimizer", "lr_schedule", "max_length", "__class__", "learning_rate"]
_META_KEYS = ["run", "hparams", "step", "epoch", "strategy", "format_version", "schedule", "callbacks",
              "precision", "train_state"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A two-step ``algorithmic_reverse`` transformer run (checkpoints at steps 1 and 2)."""
    out = tmp_path_factory.mktemp("run") / "r"
    code = cli.main(["train", "--override", TINY, "--output-dir", str(out), "--max-steps", "2", "--eval-every", "1",
                     "--strategy", "default", "--loggers", "none"])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def original(run_dir):
    """The newest checkpoint's path and payload (meta decoded)."""
    path = sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    return path, load_checkpoint(path)


@pytest.fixture(scope="module")
def resumer(tmp_path_factory):
    """One Trainer of the same run to ``--resume`` into (built once: loading is what is fuzzed)."""
    return make_trainer(None, tiny_hp("max_steps=2"), loggers=[])


def _copy_run(run_dir, root):
    target = root / "r"
    shutil.copytree(run_dir, target)
    return target


@fuzz_settings(60)
@given(mutation=byte_mutation(), manifest=st.booleans(), which=st.sampled_from(["checkpoint", "manifest"]))
def test_mutated_checkpoint_bytes(tmp_path_factory, run_dir, mutation, manifest, which):
    run = _copy_run(run_dir, tmp_path_factory.mktemp("bytes"))
    newest = sorted((run / "checkpoints").glob("step-*.ckpt"))[-1]
    if not manifest:
        manifest_path(newest).unlink()
    target = newest if which == "checkpoint" or not manifest else manifest_path(newest)
    target.write_bytes(apply_byte_mutation(target.read_bytes(), mutation))
    before = content_digests(run)
    result_or_user_error(lambda: load_checkpoint(newest, notify=lambda _: None))
    result_or_user_error(lambda: load_trained(newest, data_dir=str(run / "data"), prepare=False))
    found = result_or_user_error(lambda: find_checkpoint(output_dir=run, which="latest"))
    if not isinstance(found, Exception):
        result_or_user_error(lambda: load_trained(found, data_dir=str(run / "data"), prepare=False))
    assert content_digests(run) == before          # a damaged file is moved aside, never changed


@fuzz_settings(60)
@given(edit=st.one_of(json_edit(), field_edit(["format", "version", "file", "size", "sha256", "step"])))
def test_edited_checkpoint_manifests(tmp_path_factory, run_dir, edit):
    run = _copy_run(run_dir, tmp_path_factory.mktemp("manifest"))
    newest = sorted((run / "checkpoints").glob("step-*.ckpt"))[-1]
    record = json.loads(manifest_path(newest).read_text())
    manifest_path(newest).write_text(json.dumps(apply_json_edit(record, edit)))
    before = content_digests(run)
    text = manifest_path(newest).read_text()
    result_or_user_error(lambda: load_checkpoint(newest, notify=lambda _: None), text)
    result_or_user_error(lambda: find_checkpoint(output_dir=run, which="best"), text)
    assert content_digests(run) == before


def _edited_payload(payload, target, edit, tensor_edit):
    """A copy of the checkpoint payload with its metadata, its hparams or one entry edited."""
    out = dict(payload)
    meta = json.loads(json.dumps(payload["meta"]))
    if target == "meta":
        meta = apply_json_edit(meta, edit)
    elif target == "hparams":
        meta["hparams"] = apply_json_edit(meta["hparams"], edit)
    elif target == "run":
        meta["run"] = apply_json_edit(meta.get("run"), edit)
    else:
        kind, value = tensor_edit
        names = sorted(k for k in out if k not in ("format", "version", "meta"))
        name = names[len(str(edit)) % len(names)]
        if kind == "drop":
            del out[name]
        elif kind == "replace":
            out[name] = value
        elif isinstance(out[name], dict) and out[name]:
            state = dict(out[name])
            first = sorted(state)[len(str(value)) % len(state)]
            state[first] = torch.zeros(3, 1) if kind == "reshape" else value
            out[name] = state
    out["meta"] = meta
    return out


@fuzz_settings(120)
@given(target=st.sampled_from(["meta", "hparams", "run", "entries"]),
       edit=st.one_of(json_edit(), field_edit(_META_KEYS), field_edit(_HP_KEYS),
                      field_edit(["problem", "model", "data_dir", "raw_dir", "overrides"])),
       tensor_edit=st.tuples(st.sampled_from(["drop", "replace", "reshape", "entry"]), json_values()))
@example(target="run", edit=("set", 0, 3, "model"), tensor_edit=("drop", None))             # found by fuzzing
@example(target="meta", edit=("replace", 0, 7, "x"), tensor_edit=("drop", None))
@example(target="hparams", edit=("set", 0, -(2 ** 63), "num_heads"), tensor_edit=("drop", None))
@example(target="hparams", edit=("set", 0, "x", "dropout"), tensor_edit=("drop", None))
def test_edited_checkpoint_contents(tmp_path_factory, original, resumer, target, edit, tensor_edit):
    root = tmp_path_factory.mktemp("contents")
    path = root / "checkpoints" / "step-00000002.ckpt"
    path.parent.mkdir()
    _, payload = original
    edited = _edited_payload(payload, target, edit, tensor_edit)
    edited["meta"] = json.dumps(edited["meta"])          # as save_checkpoint writes it
    torch.save(edited, path)
    write_manifest(path, step=2)                          # a manifest that matches: the loader reads on
    (root / "data").mkdir()
    before, text = tree_digest(root), edited["meta"]
    trained = result_or_user_error(lambda: load_trained(path, data_dir=str(root / "data"), prepare=False), text)
    if not isinstance(trained, Exception):
        _assert_typed(trained.hp)
    result_or_user_error(lambda: resumer.load_checkpoint(path), text)
    assert tree_digest(root) == before


def _assert_typed(hp) -> None:
    """Every field of hparams read from a file holds its declared type (as ``--override`` makes them)."""
    hints = typing.get_type_hints(type(hp))
    for f in dataclasses.fields(hp):
        value = getattr(hp, f.name)
        assert type(typed_value(f.name, value, hints[f.name])) is type(value), f"{f.name}={value!r}"
