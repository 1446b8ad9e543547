"""hotloop: a fast, modular deep-learning training system on PyTorch.

Registries live in :mod:`hotloop.registry` (``problems``, ``models``,
``hparams_sets``, ``optimizers``, ``lr_schedules``); the subpackages
``hotloop.problems`` and ``hotloop.models`` hold the components themselves.
"""
from . import registry
from .builtin import declare_builtins
from .hparams import HParams, apply_overrides, get_hparams
from .registry import Registry, RegistryError, import_user_module

declare_builtins()

__version__ = "0.1.0"
__all__ = ["HParams", "Registry", "RegistryError", "apply_overrides", "get_hparams",
           "import_user_module", "registry", "__version__"]
