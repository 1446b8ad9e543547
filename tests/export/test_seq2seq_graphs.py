"""Seq2seq export: encoder + one-step decoder graphs; greedy/beam search on a runtime equal torch's."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from export_helpers import tiny_model
from helpers import briefly_trained

from hotloop.decode.search import beam_search, greedy_search
from hotloop.export import ExportError, export_model, load_decoder, read_manifest
from hotloop.export.seq2seq import openvino_decoding_unavailable
from hotloop.hparams import get_hparams
from hotloop.problems.base import PAD_ID, ProblemSpec
from hotloop.registry import models


def _lstm_seq2seq() -> torch.nn.Module:
    hp = get_hparams("lstm_seq2seq_algorithmic", "hidden_size=16,num_layers=2")
    torch.manual_seed(0)
    return models.get("lstm_seq2seq")(hp, ProblemSpec("seq2seq", 20, 20, 16, 17)).eval()


def _reversal_batches(count: int = 4) -> list[dict[str, torch.Tensor]]:
    """Sequence reversal: inputs [8, 6] of tokens 2..19, targets the reversed row then EOS (1)."""
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        inputs = torch.randint(2, 20, (8, 6), generator=gen)                      # [B, S]
        targets = torch.cat([inputs.flip(1), torch.ones(8, 1, dtype=torch.long)], dim=1)   # [B, S+1]
        batches.append({"inputs": inputs, "targets": targets})
    return batches


def _sources(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randint(2, 20, (3, 6), generator=gen)     # [B, S]
    inputs[1, 4:] = PAD_ID
    return inputs


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("s2s")
    transformer = briefly_trained(tiny_model("transformer", "hidden_size=16,num_layers=2,num_heads=2,filter_size=32"),
                                  _reversal_batches())
    export_model(transformer, "onnx", root / "transformer", model_name="transformer",
                 graphs=("encoder", "decoder_step"), log=lambda _msg: None)
    lstm = _lstm_seq2seq()
    export_model(lstm, "onnx", root / "lstm", model_name="lstm_seq2seq", log=lambda _msg: None)
    return {"root": root, "transformer": transformer, "lstm": lstm}


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_transformer_greedy_on_runtime_equals_torch(exported, runtime):
    model, inputs = exported["transformer"], _sources()
    lengths = torch.tensor([9, 5, 12])
    expected = greedy_search(model, inputs, lengths)
    if openvino_decoding_unavailable(runtime):     # no AVX-512: refused in one line (see its doc)
        with pytest.raises(ExportError, match="decode with --runtime onnxruntime"):
            load_decoder(exported["root"] / "transformer", runtime)
        return
    decoder = load_decoder(exported["root"] / "transformer", runtime)
    assert torch.equal(greedy_search(decoder, inputs, lengths), expected)
    # step logits too, not only the argmax path
    state_t, state_r = model.start_decoding(inputs), decoder.start_decoding(inputs)
    tokens = torch.zeros(3, dtype=torch.long)
    for step in range(4):
        logits_t, state_t = model.decode_step(tokens, state_t)
        logits_r, state_r = decoder.decode_step(tokens, state_r)
        assert (logits_t - logits_r).abs().max().item() <= 1e-4
        tokens = expected[:, step].clamp(min=2)


def test_transformer_manifest_describes_graphs_and_cache(exported):
    manifest = read_manifest(exported["root"] / "transformer")
    assert sorted(manifest["graphs"]) == ["decoder_step", "encoder"]
    step = manifest["graphs"]["decoder_step"]
    assert step["inputs"][:4] == ["tokens", "step", "memory", "src_pad"]
    assert step["outputs"] == ["logits", "cache0_out", "cache1_out", "cache2_out", "cache3_out"]
    assert step["dynamic_axes"]["cache0"] == {"0": "batch", "2": "past"}
    assert manifest["decoding"]["cache_init"][0] == {"from": "zeros", "shape": [-1, 2, 0, 8]}


def test_lstm_seq2seq_greedy_and_beam_on_runtime_equal_torch(exported):
    model, inputs = exported["lstm"], _sources(1)
    lengths = torch.tensor([7, 7, 7])
    manifest = read_manifest(exported["root"] / "lstm")
    assert sorted(manifest["graphs"]) == ["decoder_step", "encoder", "forward"]
    assert manifest["decoding"]["cache_init"] == [{"from": "source", "index": 0}, {"from": "source", "index": 1}]
    decoder = load_decoder(exported["root"] / "lstm", "onnxruntime")
    assert torch.equal(greedy_search(decoder, inputs, lengths), greedy_search(model, inputs, lengths))
    expected = beam_search(model, inputs, lengths, beam_size=3)
    got = beam_search(decoder, inputs, lengths, beam_size=3)
    assert torch.equal(got.tokens, expected.tokens)
    assert (got.scores - expected.scores).abs().max().item() <= 1e-4


def test_decoder_of_an_export_without_decoding_graphs(tmp_path):
    export_model(tiny_model("conv_net"), "safetensors", tmp_path / "conv", model_name="conv_net")
    with pytest.raises(ExportError, match="no encoder/decoder_step graphs"):
        load_decoder(tmp_path / "conv")
    with pytest.raises(ExportError, match="none of the graphs"):
        export_model(tiny_model("conv_net"), "onnx", tmp_path / "c2", model_name="conv_net", graphs=("encoder",))


def test_openvino_decoding_is_refused_without_avx512_and_onnxruntime_is_not(exported, monkeypatch):
    import hotloop.export.seq2seq as seq2seq
    from hotloop.ops.cpu_isa import CpuIsa
    monkeypatch.setattr(seq2seq, "cpu_isa", lambda: CpuIsa("test", ("avx2",), ("avx2",), ()))
    with pytest.raises(ExportError, match=r"from step 8 on CPUs without AVX-512 \(usable ISA avx2\)"):
        load_decoder(exported["root"] / "transformer", "openvino")
    assert load_decoder(exported["root"] / "transformer", "onnxruntime") is not None
