"""hotloop: a fast, modular deep-learning training system on PyTorch.

Registries live in :mod:`hotloop.registry` (``problems``, ``models``,
``hparams_sets``, ``optimizers``, ``lr_schedules``); the subpackages
``hotloop.problems`` and ``hotloop.models`` hold the components themselves.
Importing hotloop changes nothing in the process: its process-wide settings are made
by :func:`hotloop.engine.process_settings.apply_process_settings` (the CLI, ``Trainer.fit``
and the autotuner call it).
"""
from . import registry
from .builtin import declare_builtins
from .hparams import HParams, apply_overrides, get_hparams
from .registry import Registry, RegistryError, import_user_module

declare_builtins()

__version__ = "0.1.0"
__all__ = ["HParams", "Registry", "RegistryError", "Strategy", "Trainer", "apply_overrides", "auto_strategy",
           "build_run", "get_hparams", "import_user_module", "load_model", "registry", "__version__"]

#: names imported on first use (they pull in torch and the engine)
_LAZY = {"Trainer": "hotloop.train.trainer", "Strategy": "hotloop.engine.strategy",
         "auto_strategy": "hotloop.compose.plan", "build_run": "hotloop.compose.build",
         "load_model": "hotloop.export"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotloop' has no attribute {name!r}")
