"""hotloop: a fast, modular deep-learning training system on PyTorch."""
from .builtin import declare_builtins
from .hparams import HParams, apply_overrides, get_hparams
from .registry import (Registry, RegistryError, hparams_sets, import_user_module, lr_schedules,
                       models, optimizers, problems)

declare_builtins()

__version__ = "0.1.0"
__all__ = ["HParams", "Registry", "RegistryError", "apply_overrides", "get_hparams",
           "hparams_sets", "import_user_module", "lr_schedules", "models", "optimizers",
           "problems", "__version__"]
