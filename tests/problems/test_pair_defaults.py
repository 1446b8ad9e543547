"""Each built-in problem with each model that serves it defaults to an hparams set sized for the problem."""
from __future__ import annotations

import pytest

from hotloop.builtin import declare_builtins
from hotloop.compose.build import resolve_names
from hotloop.errors import UserError
from hotloop.registry import models, problems

ALGORITHMIC = ("algorithmic_copy", "algorithmic_reverse", "algorithmic_sort", "algorithmic_addition")
#: (problem, model) -> the set it defaults to
PAIRS = {
    **{(p, "transformer"): "transformer_algorithmic" for p in ALGORITHMIC},
    **{(p, "lstm_seq2seq"): "lstm_seq2seq_algorithmic" for p in ALGORITHMIC},
    **{(p, "mlp"): "mlp_algorithmic" for p in ALGORITHMIC},
    ("detection_shapes", "yolov3"): "yolov3_shapes",
    ("detection_shapes", "mask_rcnn"): "mask_rcnn_shapes",
    ("translate_multi30k_de_en", "transformer"): "transformer_multi30k",
    ("translate_multi30k_de_en", "lstm_seq2seq"): "lstm_seq2seq_multi30k",
    ("translate_wmt_en_de_nc", "transformer"): "transformer_base",
    ("ptb_lm", "lstm_lm"): "lstm_lm_small",
    ("image_mnist", "se_resnext50"): "se_resnext_small",
    ("image_synthetic", "conv_net"): "conv_net_base",
    ("segment_shapes", "deeplabv3plus"): "deeplabv3plus_small",
    ("shapes_unpaired", "cyclegan"): "cyclegan_small",
    ("bert_pretrain_ptb", "bert"): "bert_small",
    ("bert_pretrain_multi30k", "bert"): "bert_small",
}


@pytest.mark.parametrize("problem, model", sorted(PAIRS), ids=[f"{p}-{m}" for p, m in sorted(PAIRS)])
def test_pair_defaults_to_its_set(problem, model):
    _, _, name, hp = resolve_names(problem, model)
    assert name == PAIRS[problem, model]
    required = models.get(model).hparams_class
    assert isinstance(hp, required)


def test_detection_shapes_models_default_to_the_64_pixel_sets():
    """The report's case: mask_rcnn on detection_shapes read the full-size 800 px set."""
    for model in ("mask_rcnn", "yolov3"):
        _, model_cls, _, hp = resolve_names("detection_shapes", model)
        assert type(hp).__name__ == {"mask_rcnn": "MaskRCNNHParams", "yolov3": "YoloV3HParams"}[model]
        assert hp.image_size == 64


def test_every_builtin_pair_resolves_or_says_why():
    """A problem with any model serving its task: a set, or one clear error (never a traceback)."""
    declare_builtins()
    for problem in problems.names():
        task = problems.get(problem).task
        for model in models.names():
            if task not in getattr(models.get(model), "tasks", ()):
                continue
            try:
                resolve_names(problem, model)
            except UserError as exc:
                assert "\n" not in str(exc) and "--hparams" in str(exc), (problem, model, exc)
