"""Hugging Face BERT checkpoints as hotloop ``bert`` weights: the name mapping, as data.

A Hugging Face ``BertModel`` / ``BertForPreTraining`` / ``BertForSequenceClassification``
state dict (optionally under the ``bert.`` prefix; TF-era ``gamma``/``beta`` LayerNorm names
accepted) maps onto :class:`hotloop.models.bert.BERT` name by name (:data:`TOP_LEVEL`,
:data:`LAYER`), except that each layer's query, key and value projections are concatenated
into one ``qkv`` projection (:data:`QKV`, in that order along the output dimension).
:data:`IGNORED` entries have no parameter of their own in hotloop (a position-id buffer,
the MLM decoder tied to the word embeddings).

``config.json`` sizes map onto hparams fields (:data:`CONFIG_SIZES`: these must agree
with the hparams, or be taken from the config when asked); :data:`CONFIG_TRAINING` fields
(dropout rates, init range) are taken only when asked. Only ``model_type="bert"`` with
absolute positions is read: other BERT-family layouts (RoBERTa's offset positions,
DistilBERT's names) are refused in one line.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch
from torch import Tensor

from ..hparams import HParams, HParamsError
from ..problems.base import ProblemSpec

__all__ = ["TOP_LEVEL", "LAYER", "QKV", "IGNORED", "CONFIG_SIZES", "CONFIG_TRAINING", "HIDDEN_ACT",
           "from_hf_state", "to_hf_state", "check_hf_config", "config_hparams", "config_disagreement"]

#: hotloop name -> Hugging Face name, outside the encoder layers
TOP_LEVEL: dict[str, str] = {
    "word_embedding.weight": "embeddings.word_embeddings.weight",
    "position_embedding.weight": "embeddings.position_embeddings.weight",
    "segment_embedding.weight": "embeddings.token_type_embeddings.weight",
    "embed_norm.weight": "embeddings.LayerNorm.weight",
    "embed_norm.bias": "embeddings.LayerNorm.bias",
    "pooler.weight": "pooler.dense.weight",
    "pooler.bias": "pooler.dense.bias",
    "mlm_transform.weight": "cls.predictions.transform.dense.weight",
    "mlm_transform.bias": "cls.predictions.transform.dense.bias",
    "mlm_norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_bias": "cls.predictions.bias",
    "nsp_head.weight": "cls.seq_relationship.weight",
    "nsp_head.bias": "cls.seq_relationship.bias",
    "classifier.weight": "classifier.weight",
    "classifier.bias": "classifier.bias",
}
#: per encoder layer ``i``: hotloop ``layers.{i}.<key>`` <- Hugging Face ``encoder.layer.{i}.<value>``
LAYER: dict[str, str] = {
    "attn_out.weight": "attention.output.dense.weight",
    "attn_out.bias": "attention.output.dense.bias",
    "attn_norm.weight": "attention.output.LayerNorm.weight",
    "attn_norm.bias": "attention.output.LayerNorm.bias",
    "ffn_in.weight": "intermediate.dense.weight",
    "ffn_in.bias": "intermediate.dense.bias",
    "ffn_out.weight": "output.dense.weight",
    "ffn_out.bias": "output.dense.bias",
    "ffn_norm.weight": "output.LayerNorm.weight",
    "ffn_norm.bias": "output.LayerNorm.bias",
}
#: hotloop ``layers.{i}.qkv.{weight,bias}`` = these Hugging Face projections concatenated along dim 0
QKV: tuple[str, ...] = ("attention.self.query", "attention.self.key", "attention.self.value")
#: Hugging Face entries without a hotloop parameter of their own
IGNORED: tuple[str, ...] = ("embeddings.position_ids", "cls.predictions.decoder.weight",
                            "cls.predictions.decoder.bias")
#: config.json key -> hparams field that must agree with the checkpoint
CONFIG_SIZES: dict[str, str] = {
    "hidden_size": "hidden_size", "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
    "intermediate_size": "filter_size", "max_position_embeddings": "max_positions",
    "type_vocab_size": "type_vocab_size", "layer_norm_eps": "layer_norm_eps", "hidden_act": "hidden_act",
}
#: config.json key -> hparams field taken only when the config's hparams are asked for
CONFIG_TRAINING: dict[str, str] = {
    "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout",
    "initializer_range": "initializer_range",
}
#: Hugging Face ``hidden_act`` -> hotloop ``hidden_act``
HIDDEN_ACT: dict[str, str] = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

_PREFIX = "bert."
_OLD_NAMES = ((re.compile(r"LayerNorm\.gamma$"), "LayerNorm.weight"),
              (re.compile(r"LayerNorm\.beta$"), "LayerNorm.bias"))
_LAYER_NAME = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")


def _canonical(name: str) -> str:
    name = name[len(_PREFIX):] if name.startswith(_PREFIX) else name
    for pattern, new in _OLD_NAMES:
        name = pattern.sub(new, name)
    return name


def from_hf_state(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """A Hugging Face BERT state dict as hotloop ``bert`` names; returns (state, unused HF names).

    Every encoder layer the checkpoint holds is mapped (a count that differs from the model's
    shows up as missing or unexpected keys when loading).
    """
    hf = {_canonical(k): v for k, v in state.items()}
    out: dict[str, Tensor] = {}
    used = {n for n in IGNORED if n in hf}
    names = [(ours, theirs) for ours, theirs in TOP_LEVEL.items()]
    layers = sorted({int(m.group(1)) for m in map(_LAYER_NAME.match, hf) if m})
    for i in layers:
        prefix = f"encoder.layer.{i}."
        names += [(f"layers.{i}.{ours}", prefix + theirs) for ours, theirs in LAYER.items()]
        for kind in ("weight", "bias"):
            parts = [f"{prefix}{p}.{kind}" for p in QKV]
            if all(p in hf for p in parts):
                out[f"layers.{i}.qkv.{kind}"] = torch.cat([hf[p] for p in parts], dim=0)   # [3H, ...]
                used.update(parts)
    for ours, theirs in names:
        if theirs in hf:
            out[ours] = hf[theirs]
            used.add(theirs)
    return out, sorted(set(hf) - used)


def to_hf_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`from_hf_state` (a hotloop ``bert`` state dict as ``BertModel`` names)."""
    out: dict[str, Tensor] = {}
    for name, value in state.items():
        if name in TOP_LEVEL:
            out[TOP_LEVEL[name]] = value
            continue
        _, i, rest = name.split(".", 2)
        prefix = f"encoder.layer.{i}."
        if rest.startswith("qkv."):
            kind = rest.split(".")[1]
            for part, chunk in zip(QKV, value.chunk(3, dim=0)):
                out[f"{prefix}{part}.{kind}"] = chunk.contiguous()
        else:
            out[prefix + LAYER[rest]] = value
    return out


def check_hf_config(config: Any, where: str) -> dict[str, Any]:
    """``config`` (a parsed config.json) if it describes a BERT this mapping reads; one-line error otherwise."""
    if not isinstance(config, dict):
        raise HParamsError(f"{where}: expected a mapping of settings, got {type(config).__name__}")
    kind = config.get("model_type")
    if kind != "bert":
        raise HParamsError(f"{where}: model_type {kind!r} is not 'bert'; hotloop maps BERT checkpoints only")
    positions = config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        raise HParamsError(f"{where}: position_embedding_type {positions!r}; hotloop's bert has absolute positions")
    act = config.get("hidden_act", "gelu")
    if act not in HIDDEN_ACT:
        raise HParamsError(f"{where}: hidden_act {act!r}; hotloop's bert computes {', '.join(HIDDEN_ACT)}")
    missing = [k for k in CONFIG_SIZES if k not in config and k != "hidden_act"]
    if missing:
        raise HParamsError(f"{where}: no {missing[0]!r}")
    return config


def config_hparams(config: dict[str, Any], *, training: bool = True) -> dict[str, Any]:
    """The hparams changes ``config`` describes (sizes, and with ``training`` dropout and init range)."""
    fields = {**CONFIG_SIZES, **(CONFIG_TRAINING if training else {})}
    out = {ours: config[theirs] for theirs, ours in fields.items() if theirs in config}
    out["hidden_act"] = HIDDEN_ACT[config.get("hidden_act", "gelu")]
    return out


def config_disagreement(config: dict[str, Any], hp: HParams, spec: ProblemSpec | None = None) -> str | None:
    """The first field where ``config`` and the model's hparams (and ``spec``: vocabulary size,
    pad id) differ, as one phrase; else None."""
    for ours, value in config_hparams(config, training=False).items():
        mine = getattr(hp, ours, None)
        if mine != value:
            theirs = next(k for k, v in CONFIG_SIZES.items() if v == ours)
            return f"config.json {theirs}={config.get(theirs, value)!r} but the hparams have {ours}={mine!r}"
    if spec is None:
        return None
    vocab = config.get("vocab_size")
    if vocab is not None and vocab != spec.input_vocab_size:
        return (f"config.json vocab_size={vocab} but the problem's vocabulary has {spec.input_vocab_size} "
                f"entries (the problem must tokenize with the checkpoint's vocabulary)")
    pad = config.get("pad_token_id", 0)
    if pad != spec.pad_id:
        return f"config.json pad_token_id={pad} but the problem pads with id {spec.pad_id}"
    return None
