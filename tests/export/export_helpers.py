"""Tiny models and saved tiny runs shared by the export tests."""
from __future__ import annotations

from pathlib import Path

import torch

from hotloop.hparams import get_hparams, hparams_to_dict
from hotloop.problems.base import ProblemSpec
from hotloop.registry import models
from hotloop.train.checkpoint import CheckpointManager

torch.set_num_threads(1)

TINY = {
    "conv_net": ("conv_net_base", "conv_channels=4:8,image_size=8",
                 ProblemSpec("classify", 0, 10, 0, 1, pad_id=-1)),
    "lstm_lm": ("lstm_lm_small", "hidden_size=16,num_layers=2",
                ProblemSpec("lm", 40, 40, 20, 20, streamed=True, pad_id=-1)),
    "transformer": ("transformer_algorithmic", "hidden_size=16,num_layers=1,num_heads=2,filter_size=32",
                    ProblemSpec("seq2seq", 20, 20, 16, 17)),
}


def tiny_model(name: str, overrides: str | None = None, seed: int = 0) -> torch.nn.Module:
    """A tiny registered model with random (seeded) weights, in eval mode."""
    hp_name, default_overrides, spec = TINY[name]
    hp = get_hparams(hp_name, overrides or default_overrides)
    torch.manual_seed(seed)
    return models.get(name)(hp, spec).eval()


def save_run(out_dir: Path, problem: str, model_name: str, hparams: str, overrides: str) -> Path:
    """A run directory with one checkpoint, as ``hotloop train`` writes it (model weights only)."""
    hp = get_hparams(hparams, overrides)
    from hotloop.registry import problems
    spec = problems.get(problem)().spec(hp)
    torch.manual_seed(0)
    model = models.get(model_name)(hp, spec)
    meta = {"run": {"problem": problem, "model": model_name}, "hparams": hparams_to_dict(hp), "step": 1}
    CheckpointManager(out_dir / "checkpoints").save(1, meta, {"model": model.state_dict()}, valid_loss=1.0)
    return out_dir
