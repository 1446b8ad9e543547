"""No import from data: a checkpoint, manifest or config file that names a module cannot make hotloop import it.

Each test plants a module on ``sys.path`` that records its own import (it writes a marker file
at import time), names it in a file, and shows that ``eval``, ``decode``, ``load_model``,
``--resume`` and ``--config`` refuse the file in one line while the module stays unimported.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from hotloop import cli
from hotloop.hparams import HParamsError, get_hparams, hparams_from_dict, hparams_to_dict
from hotloop.train.checkpoint import CheckpointManager, load_checkpoint

pytestmark = pytest.mark.timeout(180)
TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2")
REFUSAL = "not one hotloop knows"


class Planted:
    """A module ``name`` in ``directory`` (on sys.path) whose import writes ``marker``."""

    def __init__(self, directory: Path) -> None:
        self.name = f"planted_{uuid.uuid4().hex[:10]}"
        self.marker = directory / f"{self.name}.imported"
        (directory / f"{self.name}.py").write_text(textwrap.dedent(f"""
            from dataclasses import dataclass
            from pathlib import Path

            from hotloop.problems.algorithmic import AlgorithmicHParams

            Path({str(self.marker)!r}).write_text("imported")

            @dataclass(frozen=True)
            class PlantedHParams(AlgorithmicHParams):
                pass
        """))
        self.qual = f"{self.name}:PlantedHParams"

    def assert_not_imported(self) -> None:
        assert not self.marker.exists(), "the planted module was imported"
        assert self.name not in sys.modules


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Planted:
    directory = tmp_path / "plant"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    module = Planted(directory)
    yield module
    sys.modules.pop(module.name, None)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A two-step ``algorithmic_reverse`` transformer run (checkpoints at steps 1 and 2)."""
    out = tmp_path_factory.mktemp("run") / "r"
    code = cli.main(["train", "--override", TINY, "--output-dir", str(out), "--max-steps", "2",
                     "--eval-every", "1", "--strategy", "default", "--loggers", "none"])
    assert code == 0
    return out


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def _assert_one_line_refusal(code: int, err: str, planted: Planted) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and REFUSAL in lines[0] and planted.name in lines[0], err
    planted.assert_not_imported()


def _plant_in_run(run: Path, tmp_path: Path, planted: Planted) -> Path:
    """A copy of ``run`` whose every checkpoint names the planted class."""
    copy = tmp_path / "planted_run"
    shutil.copytree(run, copy)
    manager = CheckpointManager(copy / "checkpoints")     # rewrites a file with whatever it records beside it
    for path in sorted((copy / "checkpoints").glob("*.ckpt")):
        payload = load_checkpoint(path)
        meta = payload.pop("meta")
        meta["hparams"]["__class__"] = planted.qual
        manager.save(int(meta["step"]), meta, {k: v for k, v in payload.items() if k not in ("format", "version")})
    return copy


def test_the_planted_module_records_its_import(planted):
    """The probe works: importing the module (as ``--import`` would) writes the marker."""
    from hotloop.registry import import_user_module
    import_user_module(planted.name)
    assert planted.marker.exists()
    hp = hparams_from_dict({**hparams_to_dict(get_hparams("transformer_algorithmic")), "__class__": planted.qual})
    assert type(hp).__name__ == "PlantedHParams"         # a module the user imported is trusted


def test_hparams_from_dict_refuses_before_any_import(planted):
    data = {**hparams_to_dict(get_hparams("transformer_algorithmic")), "__class__": planted.qual}
    with pytest.raises(HParamsError, match=REFUSAL):
        hparams_from_dict(data)
    for qual in ("os:path", "json:JSONDecoder", "no_colon", "a:b:c", ":X", "hotloop.hparams:nope"):
        with pytest.raises(HParamsError):
            hparams_from_dict({"__class__": qual})
    planted.assert_not_imported()


def test_eval_and_decode_refuse_a_planted_checkpoint(capsys, trained_run, tmp_path, planted):
    run = _plant_in_run(trained_run, tmp_path, planted)
    ckpt = sorted((run / "checkpoints").glob("*.ckpt"))[-1]
    _assert_one_line_refusal(*_run(capsys, "eval", "--checkpoint", str(ckpt)), planted)
    _assert_one_line_refusal(*_run(capsys, "eval", "--output-dir", str(run)), planted)
    source = tmp_path / "in.txt"
    source.write_text("3 4 5\n")
    _assert_one_line_refusal(*_run(capsys, "decode", "--checkpoint", str(ckpt), "--decode-from-file",
                                   str(source), "--decode-to-file", str(tmp_path / "out.txt")), planted)


def test_resume_refuses_a_planted_checkpoint(capsys, trained_run, tmp_path, planted):
    run = _plant_in_run(trained_run, tmp_path, planted)
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    code, err = _run(capsys, "train", "--override", TINY, "--output-dir", str(run), "--max-steps", "4",
                     "--strategy", "default", "--loggers", "none", "--resume")
    _assert_one_line_refusal(code, err, planted)
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before


def test_load_model_refuses_a_planted_manifest(tmp_path, planted):
    from hotloop.export.artifacts import MANIFEST, load_model, make_manifest, save_safetensors
    from hotloop.export.errors import ExportError
    from hotloop.registry import models, problems
    from hotloop.compose.build import build_model
    hp = get_hparams("transformer_algorithmic", TINY)
    model = build_model(models.get("transformer"), hp, problems.get("algorithmic_reverse")().spec(hp))
    out = tmp_path / "export"
    save_safetensors(model, out, make_manifest("safetensors", model, model_name="transformer",
                                               problem_name="algorithmic_reverse"))
    assert load_model(out) is not None                   # the genuine manifest loads
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["hparams"]["__class__"] = planted.qual
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match=REFUSAL) as info:
        load_model(out)
    assert "\n" not in str(info.value)
    planted.assert_not_imported()


def test_config_file_cannot_add_imports(capsys, tmp_path, planted):
    from hotloop.compose.config import ConfigError, load_config
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"imports": [planted.name], "max_steps": 1}))
    code, err = _run(capsys, "train", "--config", str(config), "--output-dir", str(tmp_path / "out"))
    assert code == 2 and f"--import {planted.name}" in err and len(err.strip().splitlines()) == 1, err
    planted.assert_not_imported()
    with pytest.raises(ConfigError, match="cannot choose code"):
        load_config(config)
    from hotloop.registry import import_user_module
    import_user_module(planted.name)                     # what `--import` on the command line does first
    assert load_config(config)["imports"] == [planted.name]


def test_registered_hparams_classes_resolve_in_a_fresh_process():
    """Checkpoints of built-in models name classes whose modules are not imported yet: the registries load them."""
    code = textwrap.dedent("""
        import sys
        from hotloop.hparams import hparams_from_dict
        for qual in ("hotloop.models.lstm_lm:LSTMLMHParams", "hotloop.problems.translation:Seq2SeqHParams"):
            module = qual.partition(":")[0]
            assert module not in sys.modules, module
            assert type(hparams_from_dict({"__class__": qual})).__qualname__ == qual.partition(":")[2]
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
