"""The built-in components, declared lazily: ``name -> "module:attr"``.

Listing names imports nothing; a component's module is imported the first
time it is looked up (and registers itself there with the same name).
This table is the one place that names every built-in.
"""
from __future__ import annotations

from .registry import Registry, hparams_sets, lr_schedules, models, optimizers, problems

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
    },
    models: {
        "mlp": "hotloop.models.mlp:MLP",
        "lstm_seq2seq": "hotloop.models.lstm_seq2seq:LSTMSeq2Seq",
        "transformer": "hotloop.models.transformer:Transformer",
        "conv_net": "hotloop.models.conv:ConvNet",
        "lstm_lm": "hotloop.models.lstm_lm:LSTMLM",
    },
    hparams_sets: {
        "transformer_multi30k": "hotloop.problems.multi30k:transformer_multi30k",
        "algorithmic_base": "hotloop.problems.algorithmic:algorithmic_base",
        "conv_net_base": "hotloop.models.conv:conv_net_base",
        "transformer_algorithmic": "hotloop.models.transformer:transformer_algorithmic",
        "mlp_algorithmic": "hotloop.models.mlp:mlp_algorithmic",
        "lstm_seq2seq_algorithmic": "hotloop.models.lstm_seq2seq:lstm_seq2seq_algorithmic",
        "lstm_lm_small": "hotloop.models.lstm_lm:lstm_lm_small",
        "lstm_lm_medium": "hotloop.models.lstm_lm:lstm_lm_medium",
        "lstm_lm_large": "hotloop.models.lstm_lm:lstm_lm_large",
        "lstm_lm_example": "hotloop.models.lstm_lm:lstm_lm_example",
    },
    optimizers: {name: f"hotloop.optim:{name}" for name in ("sgd", "momentum", "adam", "adamw")},
    lr_schedules: {
        "constant": "hotloop.optim:Constant",
        "rsqrt_decay": "hotloop.optim:RsqrtDecay",
        "cosine": "hotloop.optim:Cosine",
        "epoch_decay": "hotloop.optim:EpochDecay",
        "plateau": "hotloop.optim:Plateau",
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
