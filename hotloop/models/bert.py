"""BERT (Devlin et al., 2019) with its two pretraining heads (``task="pretrain"``) or a
sequence classifier (``task="classify"``).

Token + learned position + segment embeddings -> LayerNorm -> post-LN
Transformer encoder layers (GELU feed-forward; ``hidden_act="gelu_tanh"`` for the
tanh approximation) -> a masked-LM head (dense + GELU + LayerNorm, then the word
embedding matrix transposed, plus a bias) evaluated only at the ``mlm_positions``
of the batch, and a next-sentence head on the tanh-pooled ``[CLS]`` state. A
``classify`` model has instead one linear ``classifier`` (after dropout) on the
pooled ``[CLS]`` state, as Hugging Face's ``BertForSequenceClassification``
(``classifier_pooling="mean"``: on the mean of the non-pad token states, as
sentence-transformers pool); the encoder is Hugging Face's ``BertModel`` exactly, so its
checkpoints load (:mod:`hotloop.models.bert_hf`). ``bert_base`` is BERT-base (12 layers,
768 wide, 12 heads, 110M parameters with the 30,522-piece vocabulary);
``bert_small`` has BERT-mini's shape (4 layers, 256 wide) and ``bert_tiny``
(2 layers, 128 wide) trains in minutes on a small CPU.

Batches (see :mod:`hotloop.problems.bert_pretrain`): ``inputs``,
``segment_ids`` ``[B, T]``; ``mlm_positions``, ``targets`` ``[B, P]`` (target 0 =
no prediction); ``nsp_targets`` ``[B]``. ``forward`` returns the MLM logits
``[B, P, V]``; the loss is the mean MLM cross-entropy plus the mean NSP
cross-entropy (targets of -100 are ignored). Stats: MLM
``nll_sum``/``tokens``/``correct`` and ``nsp_nll_sum``/``nsp_correct`` over
``nsp_examples``. Classification batches: ``inputs`` (and optional ``segment_ids``,
default 0) ``[B, T]``, ``targets`` ``[B, 1]`` class ids; ``forward`` returns ``[B, 1, C]``
and the stats are ``nll_sum``/``tokens``/``examples``/``correct`` over examples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hparams import HParamsError
from ..problems.base import Batch, ProblemSpec
from ..problems.bert_pretrain import BertPretrainHParams
from ..registry import hparams_sets, models
from ..ops.dropout import dropout as apply_dropout
from .base import LossOutput, SequenceModel, fused_token_stats, token_stats
from .formulation import BITS16_OPTION, FUSED_CE_OPTIONS, Formulation, FormulationOption

__all__ = ["BERT", "BertHParams", "BertLayer", "GELU_APPROXIMATE", "bert_base", "bert_small", "bert_tiny",
           "bert_minilm_l6"]


@dataclass(frozen=True)
class BertHParams(BertPretrainHParams):
    max_positions: int = 512        # learned position embeddings
    type_vocab_size: int = 2        # segments A and B
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    hidden_act: str = "gelu"        # feed-forward and MLM-transform activation: gelu (erf) | gelu_tanh
    classifier_pooling: str = "cls"  # classify head input: cls (tanh pooler on [CLS]) | mean (of the token states)


#: ``hidden_act`` -> the ``approximate`` argument of ``F.gelu``
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}


def _gelu_approximate(hp: BertHParams) -> str:
    if hp.hidden_act not in GELU_APPROXIMATE:
        raise HParamsError(f"bert: hidden_act={hp.hidden_act!r}; use one of {', '.join(GELU_APPROXIMATE)}")
    return GELU_APPROXIMATE[hp.hidden_act]


class BertLayer(nn.Module):
    """Post-LN encoder layer: x = LN(x + attn(x)); x = LN(x + FFN_gelu(x))."""

    def __init__(self, hidden: int, heads: int, filter_size: int, dropout: float, attention_dropout: float,
                 eps: float, approximate: str = "none") -> None:
        super().__init__()
        if hidden % heads:
            raise HParamsError(f"bert: hidden_size={hidden} is not divisible by num_heads={heads}")
        self.heads, self.attention_dropout, self.approximate = heads, attention_dropout, approximate
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, filter_size)
        self.ffn_out = nn.Linear(filter_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.dropout_masks = "bernoulli"   # the attention weights' masks (Strategy.dropout_masks)

    def _attention_other_masks(self, q: Tensor, k: Tensor, v: Tensor, attend: Tensor) -> Tensor:
        """SDPA's math path with the weights' dropout drawn by ``ops.dropout`` (``dropout_masks``):
        q, k, v [B, nh, T, dh], attend bool [B, 1, 1, T] -> [B, nh, T, dh]."""
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5                     # [B, nh, T, T]
        weights = scores.masked_fill(~attend, float("-inf")).softmax(-1)            # [B, nh, T, T]
        weights = apply_dropout(weights, self.attention_dropout, True, self.dropout_masks)
        return weights @ v                                                          # [B, nh, T, dh]

    def forward(self, x: Tensor, attend: Tensor) -> Tensor:
        b, t, h = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, h // self.heads)                # [B, T, 3, nh, dh]
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                                        # each [B, nh, T, dh]
        if self.training and self.attention_dropout > 0 and self.dropout_masks != "bernoulli":
            a = self._attention_other_masks(q, k, v, attend)                        # [B, nh, T, dh]
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend,
                                               dropout_p=self.attention_dropout if self.training else 0.0)
        a = a.transpose(1, 2).reshape(b, t, h)                                      # [B, T, H]
        x = self.attn_norm(x + self.dropout(self.attn_out(a)))
        y = self.ffn_out(F.gelu(self.ffn_in(x), approximate=self.approximate))     # [B, T, H]
        return self.ffn_norm(x + self.dropout(y))


@models.register("bert")
class BERT(SequenceModel):
    """Encoder + MLM head (tied to the word embeddings) + NSP head, or + a classifier."""

    tasks = ("pretrain", "classify")
    hparams_class = BertHParams
    #: its nn.Dropout modules follow the engine; the attention weights' masks are its own;
    #: the fused MLM projection + cross-entropy
    formulation_fields = ("dropout_masks", "fused_ce", "ce_chunk_rows", "ce_gemm_dtype")

    def __init__(self, hp: BertHParams, spec: ProblemSpec) -> None:
        if not isinstance(hp, BertHParams):
            raise HParamsError(f"bert needs BertHParams (e.g. --hparams bert_small), got {type(hp).__name__}")
        super().__init__(hp, spec)
        if spec.max_input_length > hp.max_positions:
            raise HParamsError(f"bert: max_length={spec.max_input_length} exceeds "
                             f"max_positions={hp.max_positions}")
        h, vocab = hp.hidden_size, spec.input_vocab_size
        self.approximate = _gelu_approximate(hp)
        self.word_embedding = nn.Embedding(vocab, h, padding_idx=spec.pad_id)
        self.position_embedding = nn.Embedding(hp.max_positions, h)
        self.segment_embedding = nn.Embedding(hp.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=hp.layer_norm_eps)
        self.dropout = nn.Dropout(hp.dropout)
        self.layers = nn.ModuleList(
            BertLayer(h, hp.num_heads, hp.filter_size, hp.dropout, hp.attention_dropout, hp.layer_norm_eps,
                      self.approximate)
            for _ in range(hp.num_layers))
        self.pooler = nn.Linear(h, h)
        if spec.task == "classify":
            if hp.classifier_pooling not in ("cls", "mean"):
                raise HParamsError(f"bert: classifier_pooling={hp.classifier_pooling!r}; use cls or mean")
            self.classifier = nn.Linear(h, spec.target_vocab_size)
            self.head_prefixes = ("classifier",)
        else:
            self.nsp_head = nn.Linear(h, 2)
            self.mlm_transform = nn.Linear(h, h)
            self.mlm_norm = nn.LayerNorm(h, eps=hp.layer_norm_eps)
            self.mlm_bias = nn.Parameter(torch.zeros(vocab))
            self.head_prefixes = ("nsp_head", "mlm_transform", "mlm_norm", "mlm_bias")
        self.reset_parameters()

    def use_formulation(self, formulation: Formulation) -> None:
        """Also draw the attention weights' dropout masks with ``formulation.dropout_masks``."""
        super().use_formulation(formulation)
        for layer in self.layers:
            layer.dropout_masks = formulation.dropout_masks

    def formulation_options(self) -> list[FormulationOption]:
        """bits16 dropout masks when the attention weights drop (its nn.Dropout modules: the engine's);
        when pretraining, the fused MLM projection + cross-entropy."""
        options = [BITS16_OPTION] if self.hp.attention_dropout > 0 else []
        return options + (list(FUSED_CE_OPTIONS) if self.spec.task == "pretrain" else [])

    def reset_parameters(self) -> None:
        """Normal(0, initializer_range) weights, zero biases, unit LayerNorms (as BERT)."""
        std = self.hp.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.word_embedding.weight[self.spec.pad_id].zero_()
        if hasattr(self, "mlm_bias"):
            nn.init.zeros_(self.mlm_bias)

    def parameter_depth(self, name: str) -> int:
        """0 for the embeddings, ``i + 1`` for encoder layer ``i``, ``num_layers + 1`` for the
        pooler and heads (layer-wise LR decay, :mod:`hotloop.param_groups`)."""
        if name.startswith(("word_embedding.", "position_embedding.", "segment_embedding.", "embed_norm.")):
            return 0
        if name.startswith("layers."):
            return int(name.split(".")[1]) + 1
        return len(self.layers) + 1

    def encode(self, batch: Batch) -> Tensor:
        """Final hidden states [B, T, H]."""
        ids = batch["inputs"]                                                       # [B, T]
        positions = torch.arange(ids.shape[1], device=ids.device)                   # [T]
        segments = batch.get("segment_ids")
        segments = torch.zeros_like(ids) if segments is None else segments         # [B, T]
        x = self.word_embedding(ids) + self.position_embedding(positions) \
            + self.segment_embedding(segments)                                     # [B, T, H]
        x = self.dropout(self.embed_norm(x))
        attend = (ids != self.spec.pad_id)[:, None, None, :]                        # [B, 1, 1, T]
        for layer in self.layers:
            x = layer(x, attend)
        return x

    def pooled(self, x: Tensor) -> Tensor:
        """tanh(dense(the [CLS] state)): [B, T, H] -> [B, H]."""
        return torch.tanh(self.pooler(x[:, 0]))

    def head_states(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """(MLM head states [B, P, H] at ``mlm_positions``, before the vocabulary projection;
        NSP logits [B, 2])."""
        x = self.encode(batch)                                                      # [B, T, H]
        positions = batch["mlm_positions"]                                          # [B, P]
        picked = torch.gather(x, 1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # [B, P, H]
        picked = self.mlm_norm(F.gelu(self.mlm_transform(picked), approximate=self.approximate))
        return picked, self.nsp_head(self.pooled(x))

    def heads(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """(MLM logits [B, P, V] at ``mlm_positions``, NSP logits [B, 2])."""
        picked, nsp_logits = self.head_states(batch)
        return F.linear(picked, self.word_embedding.weight, self.mlm_bias), nsp_logits  # [B, P, V], [B, 2]

    def _fused_mlm(self, batch: Batch) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """``fused_ce``: the MLM projection and loss chunk by chunk -> (mean MLM loss, stats, NSP logits)."""
        picked, nsp_logits = self.head_states(batch)                                # [B, P, H], [B, 2]
        targets = batch["targets"]                                                  # [B, P]
        nll_sum, stats = fused_token_stats(picked.reshape(-1, picked.shape[-1]), self.word_embedding.weight,
                                           self.mlm_bias, targets.reshape(-1), self.formulation,
                                           training=self.training, examples=targets.shape[0],
                                           pad_id=self.spec.pad_id)
        return nll_sum / stats["tokens"].clamp(min=1), stats, nsp_logits

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        if self.spec.task == "classify":
            x = self.encode(batch)                                                  # [B, T, H]
            if self.hp.classifier_pooling == "mean":   # the mean of the non-pad token states
                keep = (batch["inputs"] != self.spec.pad_id).unsqueeze(-1).to(x.dtype)  # [B, T, 1]
                pooled = (x * keep).sum(1) / keep.sum(1).clamp(min=1)               # [B, H]
            else:
                pooled = self.pooled(x)                                             # [B, H]
            pooled = self.dropout(pooled)
            return self.classifier(pooled).unsqueeze(1), None                       # [B, 1, C]
        return self.heads(batch)[0], None

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        if self.spec.task == "classify":
            logits, _ = self(batch)                                                 # [B, 1, C]
            loss, stats = token_stats(logits, batch["targets"], with_accuracy=with_accuracy, pad_id=-1)
            stats.pop("seq_correct", None)
            return LossOutput(loss, stats, None, logits, weight=stats["tokens"])
        if self.formulation.fused_ce and not with_accuracy:
            mlm_logits = None
            mlm_loss, stats, nsp_logits = self._fused_mlm(batch)
        else:
            mlm_logits, nsp_logits = self.heads(batch)
            mlm_loss, stats = token_stats(mlm_logits, batch["targets"], with_accuracy=with_accuracy,
                                          pad_id=self.spec.pad_id)
            stats.pop("seq_correct", None)
        nsp_targets = batch["nsp_targets"]                                          # [B], -100 = none
        nsp_nll = F.cross_entropy(nsp_logits.float(), nsp_targets, ignore_index=-100, reduction="sum")
        nsp_examples = (nsp_targets != -100).sum()
        stats["nsp_nll_sum"] = nsp_nll.detach()
        stats["nsp_examples"] = nsp_examples
        if with_accuracy:
            stats["nsp_correct"] = (nsp_logits.argmax(-1) == nsp_targets).sum()
        loss = mlm_loss + nsp_nll / nsp_examples.clamp(min=1)
        return LossOutput(loss, stats, None, mlm_logits)


@hparams_sets.register("bert_base")
def bert_base() -> BertHParams:
    """BERT-base: 12 layers, 768 hidden, 12 heads, 3072 feed-forward, dropout 0.1, T=128;
    Adam(W) 1e-4, 10k warmup steps (the paper's linear decay; rsqrt here)."""
    return BertHParams(hidden_size=768, num_layers=12, num_heads=12, filter_size=3072, dropout=0.1,
                       attention_dropout=0.1, max_length=128, batch_size=32, optimizer="adamw",
                       learning_rate=1e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6,
                       weight_decay=0.01, warmup_steps=10000, lr_schedule="rsqrt_decay",
                       max_steps=1_000_000, max_grad_norm=1.0)


@hparams_sets.register("bert_small")
def bert_small() -> BertHParams:
    """4 layers, 256 hidden, 4 heads, 1024 feed-forward, T=128, batch 32: a CPU-sized BERT."""
    return BertHParams(hidden_size=256, num_layers=4, num_heads=4, filter_size=1024, dropout=0.1,
                       attention_dropout=0.1, max_length=128, batch_size=32, optimizer="adamw",
                       learning_rate=5e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6,
                       weight_decay=0.01, warmup_steps=500, lr_schedule="cosine", max_steps=6000,
                       max_grad_norm=1.0)


@hparams_sets.register("bert_tiny")
def bert_tiny() -> BertHParams:
    """2 layers, 128 hidden, 2 heads, 512 feed-forward, T=128, batch 32: minutes on a 2-core CPU."""
    return bert_small().replace(hidden_size=128, num_layers=2, num_heads=2, filter_size=512,
                                learning_rate=1e-3, max_steps=3000)


@hparams_sets.register("bert_minilm_l6")
def bert_minilm_l6() -> BertHParams:
    """all-MiniLM-L6-v2's shape (6 layers, 384 hidden, 12 heads, 1536 feed-forward) to fine-tune it
    (``--init-from``): the classifier on the mean of the token states (as the checkpoint was
    trained), AdamW 1e-4, weight decay 0.01 (none on biases and norms), 30 warmup steps, cosine
    decay over 300 steps, batch 32, T=64."""
    return BertHParams(hidden_size=384, num_layers=6, num_heads=12, filter_size=1536, dropout=0.1,
                       attention_dropout=0.1, max_length=64, batch_size=32, optimizer="adamw",
                       learning_rate=1e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6,
                       weight_decay=0.01, warmup_steps=30, lr_schedule="cosine", max_steps=300,
                       max_grad_norm=1.0, classifier_pooling="mean")
