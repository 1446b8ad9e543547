"""``hotloop decode --task``: one seq2seq task of a multi-problem (multimodel) run."""
from __future__ import annotations

import pytest
import torch

from test_decode_cli import _args, _decode, _save_run, wmt_run  # noqa: F401 - wmt_run is a fixture
from hotloop.cli import decode as decode_cli
from hotloop.decode.translate import DecodeOptions, translate_ids
from hotloop.errors import UserError
from hotloop.hparams import get_hparams
from hotloop.problems.multi_problem import multi_problem_class
from hotloop.compose.restore import find_checkpoint, load_trained

WMT = "translate_wmt_en_de_nc"
NAMES = f"{WMT},algorithmic_copy"


@pytest.fixture
def multi_run(tiny_wmt):
    cls, splits, tmp = tiny_wmt
    data = tmp / "mdata"
    cls(data_dir=data / WMT, raw_dir=tmp / "raw").prepare()     # the run's vocabulary, as datagen leaves it
    problem = multi_problem_class(NAMES)(data_dir=data)
    hp = get_hparams("multimodel_tiny").replace(hidden_size=16, filter_size=32, num_heads=2, max_length=32)
    run = _save_run(tmp / "mm_run", NAMES, "multimodel", hp, problem.spec(hp), data, "")
    return run, splits, tmp


def test_the_named_task_decodes_like_its_task_decoder(multi_run):
    run, splits, tmp = multi_run
    sources = [en for en, _ in splits["valid"]]
    lines = _decode(run, ("\n".join(sources) + "\n").encode(), tmp, task=WMT, beam_size=1, batch_size=2)
    trained = load_trained(find_checkpoint(run), device="cpu", prepare=False)
    wmt = trained.problem.subproblem(WMT)
    ids = [wmt.encoder.encode(text) for text in sources]
    with torch.no_grad():
        expected = translate_ids(trained.model.decoder_for(WMT), ids, DecodeOptions(beam_size=1), batch_size=3)
    assert lines == [wmt.encoder.decode(out) for out in expected]
    assert any(lines)                                            # the untrained model does write text
    beams = _decode(run, ("\n".join(sources) + "\n").encode(), tmp, task=WMT, beam_size=3, batch_size=4)
    assert len(beams) == len(sources)


def test_the_task_must_be_named_and_be_a_text_seq2seq_task(multi_run, wmt_run):
    run, _, tmp = multi_run
    src = tmp / "in.txt"
    src.write_text("A man.\n")
    with pytest.raises(UserError, match=f"name the task with --task.*{WMT}, algorithmic_copy"):
        decode_cli.run(_args(output_dir=run, decode_from_file=src))
    with pytest.raises(UserError, match="--task nope: not a seq2seq task.*all tasks"):
        decode_cli.run(_args(output_dir=run, decode_from_file=src, task="nope"))
    with pytest.raises(UserError, match="algorithmic_copy"):      # no text encoder: one clear line
        decode_cli.run(_args(output_dir=run, decode_from_file=src, task="algorithmic_copy"))
    with pytest.raises(UserError, match="single-problem run"):
        decode_cli.run(_args(output_dir=wmt_run[0], decode_from_file=src, task=WMT))
    with pytest.raises(UserError, match="--runtime onnxruntime: exported decoding serves single-problem"):
        decode_cli.run(_args(output_dir=run, decode_from_file=src, task=WMT, runtime="onnxruntime"))
