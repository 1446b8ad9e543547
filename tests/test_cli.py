"""The hotloop command: list, --import, train/eval round trip, and one-line errors for bad input."""
from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from hotloop import cli
from hotloop.registry import hparams_sets, models

pytestmark = pytest.mark.timeout(180)
TINY = ("hidden_size=16,filter_size=32,num_layers=1,num_heads=2,batch_size=8,train_examples=64,"
        "eval_examples=16,train_length=6,eval_length=6,warmup_steps=2")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hotloop: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_list_prints_every_registry(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for section in ("problems:", "models:", "hparams:", "optimizers:", "lr_schedules:"):
        assert section in out
    for name in ("algorithmic_reverse", "transformer", "transformer_algorithmic", "adam", "cosine"):
        assert f"  {name}\n" in out


@pytest.fixture
def user_module(tmp_path):
    tag = uuid.uuid4().hex[:8]
    model_name, hp_name = f"user_tiny_{tag}", f"user_hp_{tag}"
    path = tmp_path / f"user_components_{tag}.py"
    path.write_text(textwrap.dedent(f"""
        from hotloop.hparams import get_hparams
        from hotloop.models.transformer import Transformer
        from hotloop.registry import hparams_sets, models

        @models.register("{model_name}")
        class UserTiny(Transformer):
            pass

        @hparams_sets.register("{hp_name}")
        def user_hp():
            return get_hparams("transformer_algorithmic", "{TINY}")
    """))
    yield path, model_name, hp_name
    models.unregister(model_name)
    hparams_sets.unregister(hp_name)


def test_import_user_module_in_list_and_train(capsys, tmp_path, user_module):
    path, model_name, hp_name = user_module
    code, out, _ = run(capsys, "list", "--import", str(path))
    assert code == 0 and f"  {model_name}\n" in out and f"  {hp_name}\n" in out
    run_dir = tmp_path / "user_run"
    code, out, err = run(capsys, "train", "--import", str(path), "--model", model_name, "--hparams", hp_name,
                         "--output-dir", str(run_dir), "--max-steps", "3", "--strategy", "default")
    assert code == 0, err
    assert "done: 3 steps" in out
    assert (run_dir / "checkpoints" / "step-00000003.ckpt").is_file()
    assert (run_dir / "hparams.json").is_file() and (run_dir / "metrics.jsonl").is_file()


def test_train_eval_and_no_silent_overwrite(capsys, tmp_path):
    run_dir = tmp_path / "r"
    args = ("train", "--override", TINY, "--output-dir", str(run_dir), "--max-steps", "4",
            "--eval-every", "2", "--strategy", "default")
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "valid: loss=" in out and "seq_accuracy=" in out
    code, out, err = run(capsys, "eval", "--output-dir", str(run_dir))
    assert code == 0, err
    assert "valid: loss=" in out and "test: loss=" in out
    code, _, err = run(capsys, *args)  # same dir again without --resume
    assert_one_line_error(code, err, "already has checkpoints", "--resume")
    code, out, err = run(capsys, *args[:-4], "--max-steps", "6", "--strategy", "default", "--resume")
    assert code == 0, err
    assert "done: 6 steps" in out


def _file_dir(tmp_path: Path) -> str:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    return str(blocker / "sub")


BAD_TRAIN = {
    "unknown model": (["--model", "transfomer"], ["unknown model 'transfomer'", "did you mean 'transformer'"]),
    "unknown problem": (["--problem", "algorithmic_revers"], ["unknown problem", "algorithmic_reverse"]),
    "unknown hparams": (["--hparams", "nope"], ["unknown hparams set 'nope'"]),
    "bad override value": (["--override", "hidden_size=abc"], ["hidden_size", "abc"]),
    "unknown override key": (["--override", "hiden_size=3"], ["unknown hparam 'hiden_size'", "hidden_size"]),
    "bad override syntax": (["--override", "hidden_size"], ["expected key=value"]),
    "model mismatch": (["--model", "lstm_lm"], ["'lm'", "seq2seq"]),
    "fp16 on cpu": (["--strategy-override", "precision=fp16"], ["fp16 needs CUDA"]),
    "unknown strategy field": (["--strategy-override", "bogus=1"], ["bogus"]),
    "missing strategy file": (["--strategy", "nope.json"], ["nope.json"]),
    "unimportable module": (["--import", "no_such_module_hotloop_xyz"], ["no_such_module_hotloop_xyz"]),
    "unknown logger": (["--loggers", "jsonl,tensorbord"], ["unknown logger 'tensorbord'", "csv"]),
    "precision conflicts with override": (["--precision", "bf16", "--strategy-override", "precision=fp32"],
                                          ["--precision bf16", "precision=fp32"]),
    "accum-steps conflicts with override": (["--accum-steps", "2", "--override", "accum_steps=3"],
                                            ["--accum-steps 2", "accum_steps=3"]),
    "accum-steps below one": (["--accum-steps", "0"], ["--accum-steps must be >= 1"]),
    "missing config file": (["--config", "nope.yaml"], ["config file nope.yaml", "cannot read"]),
}


@pytest.mark.parametrize("case", sorted(BAD_TRAIN))
def test_bad_train_input_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    extra, needles = BAD_TRAIN[case]
    code, _, err = run(capsys, "train", *extra)
    assert_one_line_error(code, err, *needles)
    assert list(tmp_path.iterdir()) == []  # no runs/ directory, nothing partial


def test_unwritable_output_dir(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--output-dir", _file_dir(tmp_path))
    assert_one_line_error(code, err, "not writable")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--device", "cuda", "--output-dir", str(tmp_path / "x"))
    assert_one_line_error(code, err, "no CUDA device")
    assert not (tmp_path / "x").exists()


def test_corrupt_checkpoint_in_eval_and_resume(capsys, tmp_path):
    run_dir = tmp_path / "r"
    code, _, err = run(capsys, "train", "--override", TINY, "--output-dir", str(run_dir), "--max-steps", "2",
                       "--strategy", "default")
    assert code == 0, err
    ckpt = run_dir / "checkpoints" / "step-00000002.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # truncated
    code, _, err = run(capsys, "eval", "--checkpoint", str(ckpt))
    assert_one_line_error(code, err, str(ckpt))
    # --resume sets the damaged newest checkpoint aside (never deletes it) and resumes from the newest
    # that verifies: here none, so it starts from step 0
    code, out, err = run(capsys, "train", "--override", TINY, "--output-dir", str(run_dir), "--max-steps", "4",
                         "--strategy", "default", "--resume")
    assert code == 0, err
    assert f"checkpoint {ckpt} is damaged (it is 1000 bytes" in out and "done: 4 steps" in out
    assert (run_dir / "checkpoints" / "step-00000002.ckpt.corrupt").stat().st_size == 1000
    code, _, err = run(capsys, "eval", "--checkpoint", str(tmp_path / "missing.ckpt"))
    assert_one_line_error(code, err, "missing.ckpt")


def test_incompatible_checkpoint_on_resume(capsys, tmp_path):
    run_dir = tmp_path / "r"
    assert run(capsys, "train", "--override", TINY, "--output-dir", str(run_dir), "--max-steps", "2",
               "--strategy", "default")[0] == 0
    code, _, err = run(capsys, "train", "--override", TINY + ",hidden_size=32", "--output-dir", str(run_dir),
                       "--max-steps", "4", "--strategy", "default", "--resume")
    assert_one_line_error(code, err, "does not fit this model", "step-00000002.ckpt")


def test_broken_plugin_command_is_reported(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_plugins", lambda: {"frobnicate": "hotloop.tools.no_such_tool_xyz"})
    code, _, err = run(capsys, "frobnicate", "--x")
    assert_one_line_error(code, err, "'frobnicate'", "hotloop.tools.no_such_tool_xyz", "failed to import")


def test_plugin_command_from_an_entry_point_receives_its_arguments(capsys, monkeypatch, tmp_path):
    mod = tmp_path / f"ext_cmd_{uuid.uuid4().hex[:6]}.py"
    mod.write_text("NAME = 'extcmd'\nHELP = 'a plugin'\n"
                   "def add_arguments(p):\n    p.add_argument('--a')\n"
                   "def run(args):\n    print('got', args.a)\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "_plugins", lambda: {"extcmd": mod.stem})
    code, out, _ = run(capsys, "extcmd", "--a", "1")
    assert code == 3 and "got 1" in out
    assert "extcmd" in cli.command_names()


def test_strategy_json_file_and_override(capsys, tmp_path):
    strategy_file = tmp_path / "s.json"
    strategy_file.write_text('{"sync_every": 2, "prefetch": 0}')
    run_dir = tmp_path / "r"
    code, _, err = run(capsys, "train", "--override", TINY, "--output-dir", str(run_dir), "--max-steps", "4",
                       "--strategy", str(strategy_file), "--strategy-override", "fused_optimizer=false")
    assert code == 0, err
    import json
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4]
    saved = json.loads((run_dir / "run.json").read_text())["strategy"]
    assert saved["sync_every"] == 2 and saved["fused_optimizer"] is False
    bad = tmp_path / "bad.json"
    bad.write_text('{"sync_evry": 2}')
    code, _, err = run(capsys, "train", "--strategy", str(bad), "--output-dir", str(tmp_path / "x"))
    assert_one_line_error(code, err, "sync_evry")


def test_datagen_prepares(capsys):
    code, out, _ = run(capsys, "datagen", "--problem", "algorithmic_copy")
    assert code == 0 and "prepared algorithmic_copy" in out
    code, _, err = run(capsys, "datagen", "--problem", "algorithmic_cpy")
    assert_one_line_error(code, err, "did you mean 'algorithmic_copy'")


@pytest.mark.timeout(240)
def test_ctrl_c_saves_and_exits_with_one_line(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    repo = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "r"
    env = {**__import__("os").environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen([sys.executable, "-m", "hotloop", "train", "--override", TINY, "--output-dir",
                             str(run_dir), "--max-steps", "1000000", "--strategy", "default",
                             "--strategy-override", "sync_every=5"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.is_file() and metrics.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line
             and "self.encoder" not in line]
    assert len(lines) == 1 and lines[0].startswith("hotloop: interrupted at step"), err
    assert "Traceback" not in err
    assert list((run_dir / "checkpoints").glob("step-*.ckpt"))


BAD_CONFIG = {
    "unknown key": ('{"max_stepz": 3}', ["unknown key 'max_stepz'", "known keys:", "max_steps"]),
    "type error": ('{"max_steps": "3"}', ["'max_steps' must be integer", "'3'"]),
    "bool for int": ('{"eval_every": true}', ["'eval_every' must be integer"]),
    "not a mapping": ('[1, 2]', ["expected a mapping"]),
    "bad json": ('{"max_steps": 3', ["not valid JSON"]),
    "bad override inside": ('{"overrides": {"hiden_size": 3}}', ["unknown hparam 'hiden_size'"]),
    # a mapping's values are typed: checked as they are, never turned into text first
    "float for an int hparam": ('{"overrides": {"hidden_size": 3.5}}', ["hparam 'hidden_size' must be an integer"]),
    "bool for an int hparam": ('{"overrides": {"hidden_size": true}}', ["hparam 'hidden_size' must be an integer"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG))
def test_bad_config_file_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, case):
    text, needles = BAD_CONFIG[case]
    config = tmp_path / "run.json"
    config.write_text(text)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "train", "--config", str(config))
    assert_one_line_error(code, err, *needles)
    assert list(tmp_path.iterdir()) == [config]


def test_unreadable_config_file(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "conf.json"
    folder.mkdir()
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    monkeypatch.chdir(tmp_path)
    for path in (folder, binary):
        code, _, err = run(capsys, "train", "--config", str(path))
        assert_one_line_error(code, err, f"config file {path}", "cannot read")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin.json", "conf.json"]


def test_resume_into_a_run_of_another_problem_or_model(capsys, tmp_path):
    for key, value in (("problem", "algorithmic_copy"), ("model", "lstm_seq2seq")):
        run_dir = tmp_path / key
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps({"problem": "algorithmic_reverse", "model": "transformer",
                                                      key: value}))
        code, _, err = run(capsys, "train", "--output-dir", str(run_dir), "--resume")
        assert_one_line_error(code, err, f"holds a run of {key} {value!r}", "--output-dir")
        assert [p.name for p in run_dir.iterdir()] == ["run.json"]


def test_run_json_reproduces_the_run_and_flags_win(capsys, tmp_path):
    first = tmp_path / "a"
    code, _, err = run(capsys, "train", "--override", TINY + ",dropout=0.1", "--output-dir", str(first),
                       "--max-steps", "3", "--eval-every", "0", "--strategy", "default", "--accum-steps", "2",
                       "--loggers", "csv")
    assert code == 0, err
    saved = json.loads((first / "run.json").read_text())
    assert saved["loggers"] == "csv" and saved["max_steps"] == 3 and saved["overrides"]["accum_steps"] == 2
    again = tmp_path / "b"
    code, out, err = run(capsys, "train", "--config", str(first / "run.json"), "--output-dir", str(again))
    assert code == 0, err
    assert "done: 3 steps" in out and (again / "csv" / "train.csv").is_file()
    a = torch.load(first / "checkpoints" / "step-00000003.ckpt", weights_only=True)["model"]
    b = torch.load(again / "checkpoints" / "step-00000003.ckpt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    code, out, err = run(capsys, "train", "--config", str(first / "run.json"), "--output-dir",
                         str(tmp_path / "c"), "--max-steps", "2")
    assert code == 0 and "done: 2 steps" in out, err


def test_yaml_config_with_mappings(capsys, tmp_path):
    overrides = ", ".join(f"{k}: {v}" for k, v in (item.split("=") for item in TINY.split(",")))
    config = tmp_path / "run.yaml"
    config.write_text(f"max_steps: 2\nloggers: [jsonl, csv]\nstrategy: default\n"
                      f"strategy_overrides: {{sync_every: 1}}\noverrides: {{{overrides}}}\n"
                      f"output_dir: {tmp_path / 'y'}\n")
    code, out, err = run(capsys, "train", "--config", str(config))
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "y" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]
    assert (tmp_path / "y" / "csv" / "train.csv").is_file()


def test_nonfinite_policies_from_the_command_line(capsys, tmp_path):
    # a huge learning rate: step 1 has finite gradients, then the loss overflows
    args = ("train", "--override", TINY + ",warmup_steps=0,learning_rate=1e30", "--max-steps", "6",
            "--strategy", "default", "--strategy-override", "sync_every=2", "--loggers", "none")
    code, _, err = run(capsys, *args, "--output-dir", str(tmp_path / "stop"))
    assert_one_line_error(code, err, "non-finite loss or gradient at step 2", "steps 1-2", "--on-nonfinite skip")
    code, out, err = run(capsys, *args, "--output-dir", str(tmp_path / "skip"), "--on-nonfinite", "skip")
    assert code == 0, err
    assert "skipped 5 non-finite step(s)" in out and "done: 6 steps" in out
