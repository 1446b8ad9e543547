"""Training: the Trainer, events/callbacks, checkpoints, metrics and loggers."""
from .checkpoint import (CheckpointError, CheckpointManager, CorruptCheckpointError, load_checkpoint, save_checkpoint,
                         verify_checkpoint)
from .context import DistContext, LocalContext
from .events import Callback, CallbackList, EarlyStopping, Event
from .loggers import ConsoleLogger, JsonlLogger, ProgressBar, TensorBoardLogger, default_loggers
from .metrics import StatsAccumulator, summarize
from .runlock import RunLock, RunLockError
from .trainer import FitResult, Trainer, TrainerError

__all__ = ["Callback", "CallbackList", "CheckpointError", "CheckpointManager", "ConsoleLogger",
           "CorruptCheckpointError", "DistContext", "EarlyStopping", "Event", "FitResult", "JsonlLogger",
           "LocalContext", "ProgressBar", "RunLock", "RunLockError", "StatsAccumulator", "TensorBoardLogger",
           "Trainer", "TrainerError", "default_loggers", "load_checkpoint", "save_checkpoint", "summarize",
           "verify_checkpoint"]
