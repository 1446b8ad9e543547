"""The built-in components, declared lazily: ``name -> "module:attr"``.

Listing names imports nothing; a component's module is imported the first
time it is looked up (and registers itself there with the same name).
This table is the one place that names every built-in.
"""
from __future__ import annotations

from .registry import Registry, evaluators, hparams_sets, lr_schedules, models, optimizers, problems

__all__ = ["BUILTINS", "declare_builtins"]

BUILTINS: dict[Registry, dict[str, str]] = {
    problems: {
        "algorithmic_copy": "hotloop.problems.algorithmic:Copy",
        "algorithmic_reverse": "hotloop.problems.algorithmic:Reverse",
        "algorithmic_sort": "hotloop.problems.algorithmic:Sort",
        "algorithmic_addition": "hotloop.problems.algorithmic:Addition",
        "image_synthetic": "hotloop.problems.synthetic_images:SyntheticImages",
        "ptb_lm": "hotloop.problems.ptb:PTBLanguageModel",
        "translate_multi30k_de_en": "hotloop.problems.multi30k:Multi30kDeEn",
        "translate_wmt_en_de_nc": "hotloop.problems.wmt:TranslateWmtEnDe",
        "image_mnist": "hotloop.problems.mnist:MnistDigits",
        "segment_shapes": "hotloop.problems.shapes_segmentation:ShapesSegmentation",
        "bert_pretrain_ptb": "hotloop.problems.bert_pretrain:BertPretrainPTB",
        "bert_pretrain_multi30k": "hotloop.problems.bert_pretrain:BertPretrainMulti30k",
        "ptb_next_sentence": "hotloop.problems.next_sentence:PTBNextSentence",
        "shapes_unpaired": "hotloop.problems.shapes_unpaired:UnpairedShapes",
        "detection_shapes": "hotloop.problems.detection_shapes:DetectionShapes",
    },
    models: {
        "mlp": "hotloop.models.mlp:MLP",
        "lstm_seq2seq": "hotloop.models.lstm_seq2seq:LSTMSeq2Seq",
        "transformer": "hotloop.models.transformer:Transformer",
        "multimodel": "hotloop.models.multimodel:MultiModel",
        "conv_net": "hotloop.models.conv:ConvNet",
        "lstm_lm": "hotloop.models.lstm_lm:LSTMLM",
        "yolov3": "hotloop.models.yolov3:YoloV3",
        "mask_rcnn": "hotloop.models.mask_rcnn:MaskRCNN",
        "se_resnext50": "hotloop.models.se_resnext:SEResNeXt",
        "deeplabv3plus": "hotloop.models.deeplab:DeepLabV3Plus",
        "bert": "hotloop.models.bert:BERT",
        "cyclegan": "hotloop.models.cyclegan:CycleGAN",
    },
    hparams_sets: {
        "transformer_multi30k": "hotloop.problems.multi30k:transformer_multi30k",
        "multimodel_base": "hotloop.models.multimodel:multimodel_base",
        "multimodel_small": "hotloop.models.multimodel:multimodel_small",
        "multimodel_tiny": "hotloop.models.multimodel:multimodel_tiny",
        "algorithmic_base": "hotloop.problems.algorithmic:algorithmic_base",
        "conv_net_base": "hotloop.models.conv:conv_net_base",
        "yolov3_base": "hotloop.models.yolov3:yolov3_base",
        "yolov3_shapes": "hotloop.models.yolov3:yolov3_shapes",
        "yolov3_tiny": "hotloop.models.yolov3:yolov3_tiny",
        "mask_rcnn_base": "hotloop.models.mask_rcnn:mask_rcnn_base",
        "mask_rcnn_shapes": "hotloop.models.mask_rcnn:mask_rcnn_shapes",
        "mask_rcnn_tiny": "hotloop.models.mask_rcnn:mask_rcnn_tiny",
        "transformer_algorithmic": "hotloop.models.transformer:transformer_algorithmic",
        "transformer_base": "hotloop.models.transformer:transformer_base",
        "transformer_base_small": "hotloop.models.transformer:transformer_base_small",
        "lstm_seq2seq_multi30k": "hotloop.models.lstm_seq2seq:lstm_seq2seq_multi30k",
        "mlp_algorithmic": "hotloop.models.mlp:mlp_algorithmic",
        "lstm_seq2seq_algorithmic": "hotloop.models.lstm_seq2seq:lstm_seq2seq_algorithmic",
        "lstm_lm_small": "hotloop.models.lstm_lm:lstm_lm_small",
        "lstm_lm_medium": "hotloop.models.lstm_lm:lstm_lm_medium",
        "lstm_lm_large": "hotloop.models.lstm_lm:lstm_lm_large",
        "lstm_lm_example": "hotloop.models.lstm_lm:lstm_lm_example",
        "se_resnext50_imagenet": "hotloop.models.se_resnext:se_resnext50_imagenet",
        "se_resnext_small": "hotloop.models.se_resnext:se_resnext_small",
        "deeplabv3plus_r50": "hotloop.models.deeplab:deeplabv3plus_r50",
        "deeplabv3plus_small": "hotloop.models.deeplab:deeplabv3plus_small",
        "bert_base": "hotloop.models.bert:bert_base",
        "bert_small": "hotloop.models.bert:bert_small",
        "bert_tiny": "hotloop.models.bert:bert_tiny",
        "bert_minilm_l6": "hotloop.models.bert:bert_minilm_l6",
        "cyclegan_256": "hotloop.models.cyclegan:cyclegan_256",
        "cyclegan_small": "hotloop.models.cyclegan:cyclegan_small",
    },
    optimizers: {name: f"hotloop.optim:{name}" for name in ("sgd", "momentum", "adam", "adamw")},
    lr_schedules: {
        "constant": "hotloop.schedules:Constant",
        "linear": "hotloop.schedules:Linear",
        "cosine": "hotloop.schedules:Cosine",
        "rsqrt_decay": "hotloop.schedules:RsqrtDecay",
        "inverse_sqrt": "hotloop.schedules:InverseSqrt",
        "epoch_decay": "hotloop.schedules:EpochDecay",
        "plateau": "hotloop.schedules:Plateau",
    },
    evaluators: {
        "detect": "hotloop.detection.evaluate:evaluate_detect_task",
    },
}

_declared = False


def declare_builtins() -> None:
    """Declare every built-in name (idempotent, imports nothing)."""
    global _declared
    if _declared:
        return
    _declared = True
    for registry, table in BUILTINS.items():
        for name, target in table.items():
            if name not in registry:
                registry.add_lazy(name, target)
