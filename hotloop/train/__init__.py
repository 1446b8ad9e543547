"""Training: the Trainer, events/callbacks, checkpoints, metrics and loggers."""
from .checkpoint import CheckpointError, CheckpointManager, load_checkpoint, save_checkpoint
from .context import DistContext, LocalContext
from .events import Callback, CallbackList, EarlyStopping, Event
from .loggers import ConsoleLogger, JsonlLogger, ProgressBar, TensorBoardLogger, default_loggers
from .metrics import StatsAccumulator, summarize
from .trainer import FitResult, Trainer, TrainerError, resolve_strategy

__all__ = ["Callback", "CallbackList", "CheckpointError", "CheckpointManager", "ConsoleLogger",
           "DistContext", "EarlyStopping", "Event", "FitResult", "JsonlLogger", "LocalContext",
           "ProgressBar", "StatsAccumulator", "TensorBoardLogger", "Trainer", "TrainerError",
           "default_loggers", "load_checkpoint", "resolve_strategy", "save_checkpoint", "summarize"]
