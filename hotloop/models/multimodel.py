"""MultiModel: per-problem bottoms and tops around one shared transformer encoder-decoder.

For a :class:`~hotloop.problems.multi_problem.MultiProblemSpec` (``--problem a,b,c``):

- **bottoms**: one token embedding (+ learned positions) per *vocabulary* (problems
  with the same vocabulary key share it, for source and target tokens), and one image
  stem per image problem (``image_stem=patches``: a stride-p convolution, ViT style;
  ``conv``: two stride-2 3x3 convolutions), with learned positions;
- **tops**: a softmax over each vocabulary (optionally tied to its embedding), a class
  head per classification problem;
- **body**: one :class:`~hotloop.models.transformer.TransformerBody` for every task;
- **task token**: each task owns a learned vector. Seq2seq decoders start from it instead
  of the shared start symbol (T2T style: tasks that share a vocabulary learn which task
  they are doing); an LM's encoder reads it alone (the decoder runs causally over the
  inputs); a classifier's decoder reads it as its one query over the encoded input.

The task of a batch is its ``task:<name>`` key (:func:`~hotloop.problems.mixing.task_of`),
so a captured step specialises per task without reading a device value. The model carries
no state between batches (a streamed LM is read as independent windows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..problems.algorithmic import AlgorithmicHParams
from ..problems.base import PAD_ID, Batch, ProblemSpec
from ..problems.mixing import task_of
from ..problems.multi_problem import MixingHParams, MultiProblemSpec, TaskSpec
from ..problems.synthetic_images import SyntheticImageHParams
from ..registry import hparams_sets, models
from .base import LossOutput, ModelMismatchError, SequenceModel, token_stats
from .encoder_decoder import Seq2SeqHParams
from .layers import OutputTop
from .transformer import TransformerBody

__all__ = ["MultiModel", "MultiModelHParams", "TextBottom", "ImageStem", "multimodel_base", "multimodel_small",
           "multimodel_tiny"]


@dataclass(frozen=True)
class MultiModelHParams(Seq2SeqHParams, MixingHParams, AlgorithmicHParams, SyntheticImageHParams):
    """The body's sizes, the mixing schedule, and every field the built-in problems read."""

    image_stem: str = "patches"   # patches | conv
    patch_size: int = 4           # image_stem=patches: side of a square patch


def _module_key(text: str) -> str:
    """A ModuleDict key for a problem or vocabulary name (no dots)."""
    return text.replace(".", "_")


class TextBottom(nn.Module):
    """ids [B, T] -> [B, T, H]: scaled token embedding + learned positions; ``prefix`` [B, 1, H]
    (a task token) replaces the first position's token when given."""

    def __init__(self, vocab_size: int, hidden: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(max(1, max_len), hidden)
        self.scale = math.sqrt(hidden)
        self.dropout = nn.Dropout(dropout)
        nn.init.normal_(self.tokens.weight, std=hidden ** -0.5)

    def forward(self, ids: Tensor, prefix: Tensor | None = None) -> Tensor:
        x = self.tokens(ids) * self.scale                                  # [B, T, H]
        if prefix is not None:
            x = torch.cat([prefix, x[:, :-1]], dim=1)                      # [B, T, H]
        return self.dropout(x + self.positions.weight[: x.shape[1]])


class ImageStem(nn.Module):
    """images [B, C, S, S] -> [B, P, H] (patches or a small conv stem) + learned positions."""

    def __init__(self, hp: MultiModelHParams) -> None:
        super().__init__()
        c, h = hp.image_channels, hp.hidden_size
        if hp.image_stem == "patches":
            if hp.patch_size < 1 or hp.image_size % hp.patch_size:
                raise ModelMismatchError(f"multimodel: image_size={hp.image_size} is not a multiple of "
                                         f"patch_size={hp.patch_size}")
            self.net: nn.Module = nn.Conv2d(c, h, hp.patch_size, stride=hp.patch_size)
        elif hp.image_stem == "conv":
            self.net = nn.Sequential(nn.Conv2d(c, h // 2, 3, stride=2, padding=1), nn.GELU(),
                                     nn.Conv2d(h // 2, h, 3, stride=2, padding=1))
        else:
            raise ModelMismatchError(f"multimodel: unknown image_stem {hp.image_stem!r}; use patches or conv")
        with torch.no_grad():
            grid = self.net(torch.zeros(1, c, hp.image_size, hp.image_size)).shape[-2:]
        self.positions = nn.Parameter(torch.randn(grid[0] * grid[1], h) * 0.02)   # [P, H]

    def forward(self, images: Tensor) -> Tensor:
        x = self.net(images)                                               # [B, H, h, w]
        return x.flatten(2).transpose(1, 2) + self.positions               # [B, P, H]


def _as_multi_spec(spec: ProblemSpec) -> MultiProblemSpec:
    if isinstance(spec, MultiProblemSpec):
        return spec
    raise ModelMismatchError("multimodel trains MultiProblem runs: pass --problem a,b,... (one name "
                             "works too, the run builder wraps it)")


@models.register("multimodel")
class MultiModel(SequenceModel):
    """See the module doc. ``tasks=("multi",)``: the run builder wraps a single problem."""

    tasks: ClassVar[tuple[str, ...]] = ("multi",)
    hparams_class = MultiModelHParams
    #: read by :func:`hotloop.compose.build.resolve_names`: wrap single problems in a MultiProblem
    multi_problem: ClassVar[bool] = True

    def __init__(self, hp: MultiModelHParams, spec: ProblemSpec) -> None:
        super().__init__(hp, spec)
        multi = _as_multi_spec(spec)
        h = hp.hidden_size
        self.task_specs: dict[str, TaskSpec] = {t.name: t for t in multi.tasks}
        self.task_tokens = nn.Embedding(len(multi.tasks), h)
        nn.init.normal_(self.task_tokens.weight, std=1.0)
        self.body = TransformerBody(hp)
        self.embeddings, self.softmax = nn.ModuleDict(), nn.ModuleDict()
        self.stems, self.class_heads = nn.ModuleDict(), nn.ModuleDict()
        for vocab, tasks in self._vocabularies(multi.tasks).items():
            size = max(max(t.spec.input_vocab_size, t.spec.target_vocab_size) for t in tasks)
            length = max(max(t.spec.max_input_length, t.spec.max_target_length) for t in tasks)
            self.embeddings[vocab] = TextBottom(size, h, length, hp.dropout)
            if any(t.spec.task != "classify" for t in tasks):
                self.softmax[vocab] = OutputTop(h, size)
                if hp.tie_embeddings:
                    self.softmax[vocab].proj.weight = self.embeddings[vocab].tokens.weight
        for t in multi.tasks:
            if t.spec.task not in ("seq2seq", "lm", "classify"):
                raise ModelMismatchError(f"multimodel: problem {t.name!r} is a {t.spec.task!r} task; "
                                         f"it serves seq2seq, lm and classify problems")
            if t.is_image:
                self.stems[_module_key(t.name)] = ImageStem(hp)
            if t.spec.task == "classify":
                self.class_heads[_module_key(t.name)] = nn.Linear(h, t.spec.target_vocab_size)

    @staticmethod
    def _vocabularies(tasks: tuple[TaskSpec, ...]) -> dict[str, list[TaskSpec]]:
        groups: dict[str, list[TaskSpec]] = {}
        for t in tasks:
            if not t.is_image:
                groups.setdefault(_module_key(t.vocabulary), []).append(t)
        return groups

    def decoder_for(self, task_name: str) -> nn.Module:
        """The incremental decoder of seq2seq task ``task_name`` (:class:`~.multimodel_decoding.TaskDecoder`)."""
        from .multimodel_decoding import TaskDecoder
        task = self.task_specs.get(task_name)
        seq2seq = sorted(n for n, t in self.task_specs.items() if t.spec.task == "seq2seq")
        if task is None or task.spec.task != "seq2seq":
            raise ModelMismatchError(f"multimodel decodes seq2seq tasks; {task_name!r} is not one of this "
                                     f"run's ({', '.join(seq2seq) or 'none'})")
        return TaskDecoder(self, task)

    def task_view(self, task_name: str) -> nn.Module:
        """Task ``task_name`` as a one-problem model (:class:`~.multimodel_decoding.TaskView`)."""
        from .multimodel_decoding import TaskView
        if task_name not in self.task_specs:
            raise ModelMismatchError(f"multimodel has no task {task_name!r}; this run's tasks: "
                                     f"{', '.join(sorted(self.task_specs))}")
        return TaskView(self, self.task_specs[task_name])

    def task_token(self, task: TaskSpec, batch_size: int) -> Tensor:
        """The task's learned vector, [B, 1, H]."""
        return self.task_tokens.weight[task.index].expand(batch_size, 1, -1)

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        task = self.task_specs[task_of(batch)]
        inputs = batch["inputs"]
        b = inputs.shape[0]
        kind, vocab = task.spec.task, _module_key(task.vocabulary)
        if kind == "seq2seq":
            embed = self.embeddings[vocab]
            src, src_pad = embed(inputs), inputs == PAD_ID                          # [B, S, H], [B, S]
            tgt = embed(batch["targets"], prefix=self.task_token(task, b))         # [B, T, H]
            return self.softmax[vocab](self.body(src, tgt, src_pad)), None         # [B, T, V]
        if kind == "lm":
            src = self.task_token(task, b)                                         # [B, 1, H]
            src_pad = torch.zeros(src.shape[:2], dtype=torch.bool, device=src.device)
            tgt = self.embeddings[vocab](inputs)                                   # [B, T, H]
            return self.softmax[vocab](self.body(src, tgt, src_pad)), None         # [B, T, V]
        key = _module_key(task.name)
        if task.is_image:
            src = self.stems[key](inputs)                                          # [B, P, H]
            src_pad = torch.zeros(src.shape[:2], dtype=torch.bool, device=src.device)
        else:
            src, src_pad = self.embeddings[vocab](inputs), inputs == PAD_ID        # [B, S, H]
        hidden = self.body(src, self.task_token(task, b), src_pad)                 # [B, 1, H]
        return self.class_heads[key](hidden), None                                 # [B, 1, K]

    def loss(self, batch: Batch, state: Any = None, *, with_accuracy: bool = False) -> LossOutput:
        task = self.task_specs[task_of(batch)]
        logits, _ = self(batch, state)
        loss, stats = token_stats(logits, batch["targets"], with_accuracy=with_accuracy,
                                  label_smoothing=self.hp.label_smoothing if self.training else 0.0,
                                  pad_id=task.spec.pad_id)
        return LossOutput(loss, stats, None, logits, weight=stats["tokens"])


@hparams_sets.register("multimodel_base")
def multimodel_base() -> MultiModelHParams:
    """Multi30k de-en + PTB + MNIST digits on one pre-norm transformer (d 256, 3+3 layers, 4 heads,
    FFN 1024, dropout 0.1): 64 PTB windows of 35 words, 4096-token Multi30k batches, 64 digits
    of 28x28 cut into 7x7 patches of 4x4; temperature-2 mixing (p ~ sqrt(batches per epoch))."""
    return MultiModelHParams(hidden_size=256, num_layers=3, num_heads=4, filter_size=1024, dropout=0.1,
                             label_smoothing=0.1, batch_size=64, batch_tokens=4096, optimizer="adam",
                             learning_rate=1e-3, adam_beta2=0.98, lr_schedule="rsqrt_decay",
                             warmup_steps=1000, max_grad_norm=1.0, max_steps=30000,
                             image_channels=1, image_size=28, image_stem="patches", patch_size=4,
                             mixing="temperature", mixing_temperature=2.0)


@hparams_sets.register("multimodel_small")
def multimodel_small() -> MultiModelHParams:
    """``multimodel_base`` at about a fifth of the cost, for measured comparisons on a CPU: d 128,
    2+2 layers, FFN 512, 2048-token Multi30k batches, 32 PTB windows or digits, 500 warm-up steps,
    uniform mixing (equal steps per task)."""
    return replace(multimodel_base(), hidden_size=128, num_layers=2, filter_size=512, batch_size=32,
                   batch_tokens=2048, warmup_steps=500, max_steps=6000, mixing="uniform")


@hparams_sets.register("multimodel_tiny")
def multimodel_tiny() -> MultiModelHParams:
    """Seconds on a CPU (tests): d 32, 1+1 layers; algorithmic lengths 6, 8x8 synthetic images."""
    return MultiModelHParams(hidden_size=32, num_layers=1, num_heads=2, filter_size=64, dropout=0.0,
                             batch_size=8, batch_tokens=256, optimizer="adam", learning_rate=3e-3,
                             lr_schedule="constant", max_grad_norm=1.0, max_steps=100,
                             train_length=6, eval_length=6, train_examples=256, eval_examples=32,
                             image_channels=1, image_size=8, image_stem="patches", patch_size=4,
                             mixing="proportional")
