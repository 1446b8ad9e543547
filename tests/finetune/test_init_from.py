"""``--init-from`` a hotloop checkpoint, run directory or export: partial and strict loads, head swap,
a fresh run (step 0, fresh optimizer), one-line errors for unusable paths."""
from __future__ import annotations

import pickle

import pytest
import torch

from finetune_helpers import TinyPairs, state_of, tiny_bert, tiny_bert_hp, tiny_trainer
from hotloop import cli
from hotloop.train.init_from import InitFromError, init_model, read_init_weights


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step run of a 2-class tiny bert, with its checkpoints."""
    out = tmp_path_factory.mktemp("source") / "run"
    trainer = tiny_trainer(output_dir=out)
    trainer.fit()
    return out


def _saved_model(run_dir):
    return read_init_weights(run_dir).state


def test_run_directory_initialises_weights_only_and_starts_at_step_zero(run_dir):
    saved = _saved_model(run_dir)
    trainer = tiny_trainer(tiny_bert(seed=5), init_from=run_dir)
    assert trainer.init_report.complete and trainer.init_report.kind == "hotloop checkpoint"
    assert any("loaded 33 of the model's 33 tensors" in n for n in trainer.notices)
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0)
    assert trainer.step == 0 and not trainer.optimizer.state          # a fresh optimizer
    result = trainer.fit()
    assert result.steps == 2                                            # max_steps from step 0, not resumed


def test_checkpoint_file_and_partial_load_into_the_pretrain_heads(run_dir):
    ckpt = sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    model = tiny_bert(task="pretrain")
    fresh = state_of(model)
    report = init_model(model, ckpt)
    assert report.unexpected == ["classifier.bias", "classifier.weight"]
    assert set(report.missing) == {"nsp_head.weight", "nsp_head.bias", "mlm_transform.weight",
                                   "mlm_transform.bias", "mlm_norm.weight", "mlm_norm.bias", "mlm_bias"}
    for name in report.missing:                                        # left at their fresh init
        torch.testing.assert_close(model.state_dict()[name], fresh[name], rtol=0, atol=0)
    lines = report.lines()
    assert "7 missing from the source" in lines[1] and "2 unexpected" in lines[2]


def test_a_new_head_when_the_class_count_differs(run_dir):
    saved = _saved_model(run_dir)
    model = tiny_bert(classes=3, seed=7)
    fresh = state_of(model)
    report = init_model(model, run_dir)
    assert report.mismatched == ["classifier.bias: source [2] vs model [3]",
                                 "classifier.weight: source [2, 16] vs model [3, 16]"]
    assert not report.missing and not report.unexpected
    state = model.state_dict()
    torch.testing.assert_close(state["classifier.weight"], fresh["classifier.weight"], rtol=0, atol=0)
    torch.testing.assert_close(state["layers.1.qkv.weight"], saved["layers.1.qkv.weight"], rtol=0, atol=0)
    assert "shape mismatch (fresh init): classifier.bias" in report.lines()[-1]


def test_strict_loading_refuses_what_does_not_fit_and_copies_nothing(run_dir):
    model = tiny_bert(classes=3, seed=7)
    fresh = state_of(model)
    with pytest.raises(InitFromError, match=r"strict loading: 2 mismatched \(classifier.bias"):
        init_model(model, run_dir, strict=True)
    torch.testing.assert_close(model.state_dict()["layers.0.qkv.weight"], fresh["layers.0.qkv.weight"])
    assert init_model(tiny_bert(seed=3), run_dir, strict=True).complete


def test_safetensors_export_directory_and_a_corrupt_one(run_dir, tmp_path):
    from hotloop.export import export_model
    source = tiny_bert(seed=11)
    export_model(source, "safetensors", tmp_path / "export", model_name="bert", log=lambda _: None)
    model = tiny_bert(seed=12)
    report = init_model(model, tmp_path / "export", strict=True)
    assert report.kind == "hotloop export"
    torch.testing.assert_close(model.state_dict()["pooler.weight"], source.state_dict()["pooler.weight"])
    weights = tmp_path / "export" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(InitFromError, match="truncated or corrupt: its size or sha256"):
        init_model(model, tmp_path / "export")


def test_unusable_paths_are_one_line_errors(tmp_path):
    garbage = tmp_path / "weights.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    (tmp_path / "empty").mkdir()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bert", "hidden_size": 16}')
    with open(hf / "pytorch_model.bin", "wb") as f:
        pickle.dump({"weights": object()}, f)
    cases = {tmp_path / "missing": "no such file or directory", garbage: "is damaged: it is not a complete zip archive",
             tmp_path / "empty": "not a hotloop checkpoint, run directory, safetensors export",
             hf: "no 'num_hidden_layers'"}
    for path, reason in cases.items():
        with pytest.raises(InitFromError, match=reason) as info:
            read_init_weights(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
    (hf / "config.json").write_text('{"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, '
                                    '"num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 16, '
                                    '"type_vocab_size": 2, "layer_norm_eps": 1e-12}')
    with pytest.raises(InitFromError, match="refusing to unpickle"):
        read_init_weights(hf)


def test_cli_init_from_a_garbage_file_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    garbage = tmp_path / "weights.ckpt"
    garbage.write_bytes(b"\x00" * 64)
    out = tmp_path / "run"
    code = cli.main(["train", "--problem", "algorithmic_reverse", "--model", "transformer", "--hparams",
                     "transformer_algorithmic", "--init-from", str(garbage), "--output-dir", str(out),
                     "--max-steps", "1", "--strategy", "default"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--init-from" in err
    assert not out.exists()


def test_cli_init_from_a_run_directory_and_the_config_key(tmp_path, capsys):
    source = tmp_path / "source"
    args = ["train", "--problem", "algorithmic_reverse", "--model", "transformer", "--hparams",
            "transformer_algorithmic", "--override", "hidden_size=16,num_layers=1,num_heads=2,filter_size=32,"
            "batch_size=8", "--max-steps", "2", "--strategy", "default", "--loggers", "none", "--eval-every", "0"]
    assert cli.main(args + ["--output-dir", str(source)]) == 0
    capsys.readouterr()
    assert cli.main(args + ["--output-dir", str(tmp_path / "b"), "--init-from", str(source), "--init-strict"]) == 0
    out = capsys.readouterr().out
    assert "init-from" in out and "(hotloop checkpoint): loaded" in out and "done: 2 steps" in out
    import json
    recorded = json.loads((tmp_path / "b" / "run.json").read_text())     # --config run.json repeats it
    assert recorded["init_from"] == str(source) and recorded["init_strict"] is True
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"problem": "algorithmic_reverse", "model": "transformer",
                                  "hparams": "transformer_algorithmic", "init_from": str(source),
                                  "init_strict": True, "overrides": {"hidden_size": 32, "num_layers": 1,
                                                                     "num_heads": 2, "filter_size": 32}}))
    code = cli.main(["train", "--config", str(config), "--output-dir", str(tmp_path / "c"), "--max-steps", "1",
                     "--strategy", "default", "--loggers", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "strict loading" in err and "mismatched" in err


def test_trainer_problem_is_unchanged_by_init(run_dir):
    """An init that loads everything changes no hparams or problem: the valid metrics of the
    initialised model are those of the source run's final model."""
    source = tiny_trainer(tiny_bert(), init_from=run_dir)
    again = tiny_trainer(tiny_bert(seed=9), init_from=run_dir)
    assert source.evaluate("valid") == again.evaluate("valid")
    assert isinstance(source.problem, TinyPairs) and source.hp == tiny_bert_hp()
