"""``hotloop decode``: file/stdin streaming, input order, and one clear line per bad input."""
from __future__ import annotations

import argparse

import pytest
import torch

from helpers import briefly_trained
from hotloop.cli import decode as decode_cli
from hotloop.errors import UserError
from hotloop.export.seq2seq import openvino_decoding_unavailable
from hotloop.hparams import get_hparams, hparams_to_dict
from hotloop.registry import models
from hotloop.train.checkpoint import CheckpointManager

torch.set_num_threads(1)


def _save_run(out_dir, problem_name, model_name, hp, spec, data_dir, raw_dir, train_on=None):
    torch.manual_seed(0)
    model = models.get(model_name)(hp, spec)
    if train_on is not None:          # decisive greedy choices (see helpers.briefly_trained)
        batches = [b for _, b in zip(range(8), train_on.reader("train", hp))]
        briefly_trained(model, batches)
    meta = {"run": {"problem": problem_name, "model": model_name, "data_dir": str(data_dir),
                    "raw_dir": str(raw_dir)}, "hparams": hparams_to_dict(hp), "step": 1}
    CheckpointManager(out_dir / "checkpoints").save(1, meta, {"model": model.state_dict()}, valid_loss=1.0)
    return out_dir


@pytest.fixture
def wmt_run(tiny_wmt):
    cls, splits, tmp = tiny_wmt
    problem = cls(data_dir=tmp / "data", raw_dir=tmp / "raw")
    problem.prepare()
    hp = get_hparams("transformer_base_small").replace(hidden_size=32, num_heads=4, filter_size=64, num_layers=1,
                                                       max_length=16)
    run = _save_run(tmp / "run", "translate_wmt_en_de_nc", "transformer", hp, problem.spec(hp),
                    tmp / "data", tmp / "raw", train_on=problem)
    return run, splits, tmp


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    decode_cli.add_arguments(parser)
    argv = []
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return parser.parse_args(argv + ["--device", "cpu"])


def _decode(run, inputs: bytes, tmp, **kw) -> list[str]:
    src, dst = tmp / "in.txt", tmp / "out.txt"
    src.write_bytes(inputs)
    assert decode_cli.run(_args(output_dir=run, decode_from_file=src, decode_to_file=dst, **kw)) == 0
    return dst.read_text(encoding="utf-8").split("\n")[:-1]


def test_order_batching_and_empty_lines(wmt_run):
    run, splits, tmp = wmt_run
    sources = [en for en, _ in splits["valid"] + splits["test"]]
    sources.insert(2, "")
    sources.insert(5, "   ")
    text = ("\n".join(sources) + "\n").encode()
    batched = _decode(run, text, tmp, beam_size=1, batch_size=3)
    single = _decode(run, text, tmp, beam_size=1, batch_size=1)
    assert len(batched) == len(sources) and batched == single
    assert batched[2] == "" and batched[5] == ""
    assert any(line for line in batched)     # the untrained model does produce text
    beams = _decode(run, text, tmp, beam_size=3, alpha=0.6, batch_size=4, max_length=3)
    assert len(beams) == len(sources) and beams[2] == ""


def test_non_utf8_line_keeps_earlier_lines(wmt_run):
    run, splits, tmp = wmt_run
    good = [en for en, _ in splits["valid"][:4]]
    data = ("\n".join(good) + "\n").encode() + b"bad \xff line\n" + b"never decoded\n"
    src, dst = tmp / "in.txt", tmp / "out.txt"
    src.write_bytes(data)
    with pytest.raises(UserError, match=r"line 5: not UTF-8 \(byte 0xff"):
        decode_cli.run(_args(output_dir=run, decode_from_file=src, decode_to_file=dst, beam_size=1, batch_size=2))
    assert len(dst.read_text(encoding="utf-8").split("\n")[:-1]) == 4


def test_long_line_is_cut_with_a_warning(wmt_run, capsys):
    run, _, tmp = wmt_run
    long_line = " ".join(["the old red house"] * 20)
    out = _decode(run, f"A man.\n{long_line}\n".encode(), tmp, beam_size=2)
    assert len(out) == 2
    err = capsys.readouterr().err
    assert "line 2:" in err and "maximum input length 16" in err


def test_run_without_vocabulary(wmt_run):
    run, _, tmp = wmt_run
    (tmp / "empty").mkdir()
    with pytest.raises(UserError, match="no prepared vocabulary.*hotloop datagen"):
        decode_cli.run(_args(output_dir=run, data_dir=tmp / "empty", decode_from_file=tmp / "none.txt"))


def test_sampling_flags_on_seq2seq_and_beam_flags_on_lm(wmt_run):
    run, _, tmp = wmt_run
    with pytest.raises(UserError, match="--top-k.*seq2seq.*sampling flags are for language models"):
        decode_cli.run(_args(output_dir=run, top_k=5))
    hp = get_hparams("lstm_lm_small").replace(hidden_size=16)
    spec = __import__("hotloop.problems.base", fromlist=["ProblemSpec"]).ProblemSpec(
        "lm", 10000, 10000, 20, 20, streamed=True, pad_id=-1)
    lm_run = _save_run(tmp / "lm_run", "ptb_lm", "lstm_lm", hp, spec, tmp / "nodata", tmp / "noraw")
    with pytest.raises(UserError, match="--beam-size.*language-model run.*beam flags are for seq2seq"):
        decode_cli.run(_args(output_dir=lm_run, beam_size=4))


def test_missing_input_file_and_checkpoint(wmt_run, tmp_path):
    run, _, tmp = wmt_run
    with pytest.raises(UserError, match="--decode-from-file .*nope.txt"):
        decode_cli.run(_args(output_dir=run, decode_from_file=tmp / "nope.txt"))
    with pytest.raises(UserError, match="no checkpoint"):
        decode_cli.run(_args(output_dir=tmp_path / "norun"))


def test_stdin_to_stdout(wmt_run, monkeypatch, capsys):
    import io
    import sys
    run, splits, _ = wmt_run
    lines = [en for en, _ in splits["test"]]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(("\n".join(lines) + "\n").encode())))
    assert decode_cli.run(_args(output_dir=run, beam_size=2, batch_size=2)) == 0
    assert len(capsys.readouterr().out.split("\n")[:-1]) == len(lines)


@pytest.fixture
def lm_run(tmp_path):
    """A word-level LM run (ptb_lm) over a stand-in prepared vocabulary: w0..w9997, <eos>, <unk>."""
    from hotloop.data.shards import ShardWriter
    from hotloop.problems.ptb import VOCAB_SIZE, PTBLanguageModel
    vocab = [f"w{i}" for i in range(VOCAB_SIZE - 2)] + ["<eos>", "<unk>"]
    writer = ShardWriter(tmp_path / "ptb", "ptb_lm", PTBLanguageModel.config)
    writer.add_text("vocab.txt", "\n".join(vocab) + "\n")
    writer.finish({"vocab_size": VOCAB_SIZE})
    hp = get_hparams("lstm_lm_small").replace(hidden_size=16)
    problem = PTBLanguageModel(data_dir=tmp_path / "ptb", raw_dir=tmp_path / "noraw")
    return _save_run(tmp_path / "lm_run", "ptb_lm", "lstm_lm", hp, problem.spec(hp), tmp_path / "ptb",
                     tmp_path / "noraw")


def test_lm_sampling_end_to_end(lm_run, tmp_path):
    prompts = b"w3 w4 w5\n\nw7 unknownword\n"
    first = _decode(lm_run, prompts, tmp_path, seed=3, max_length=6, batch_size=2)
    assert len(first) == 3 and all(len(line.split()) <= 6 for line in first)
    assert all(w.startswith("w") or w == "<unk>" for line in first for w in line.split())
    assert _decode(lm_run, prompts, tmp_path, seed=3, max_length=6, batch_size=2) == first
    others = [_decode(lm_run, prompts, tmp_path, seed=s, max_length=6, batch_size=2) for s in (4, 5)]
    assert any(o != first for o in others)
    greedy = _decode(lm_run, prompts, tmp_path, top_k=1, max_length=6)
    assert greedy == _decode(lm_run, prompts, tmp_path, top_k=1, max_length=6, seed=9)   # no randomness left


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_runtime_decoding_of_the_exported_graphs_equals_torch(wmt_run, runtime):
    """`hotloop decode --runtime R` on `hotloop export` graphs writes the same greedy lines as torch."""
    from hotloop.cli import main
    run, splits, tmp = wmt_run
    folder = "onnx" if runtime == "onnxruntime" else "openvino"
    assert main(["export", "--output-dir", str(run), "--format", folder]) == 0
    sources = "\n".join(en for en, _ in splits["test"][:6]).encode() + b"\n"
    refusal = openvino_decoding_unavailable(runtime)
    if refusal:                      # this CPU has no AVX-512: the runtime is refused, in one line
        with pytest.raises(UserError, match="OpenVINO's cached decoding gives wrong logits"):
            _decode(run, sources, tmp, beam_size=1, runtime=runtime)
        return
    torch_lines = _decode(run, sources, tmp, beam_size=1)
    runtime_lines = _decode(run, sources, tmp, beam_size=1, runtime=runtime)
    assert runtime_lines == torch_lines and len(torch_lines) == len(splits["test"][:6]) > 1
