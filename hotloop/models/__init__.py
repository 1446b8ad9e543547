"""Models: bottom (embedding) -> body -> top (output)."""
from .base import LossOutput, ModelMismatchError, SequenceModel, token_stats

__all__ = ["LossOutput", "ModelMismatchError", "SequenceModel", "token_stats"]
