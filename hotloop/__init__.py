"""hotloop: a fast, modular deep-learning training system on PyTorch.

Registries live in :mod:`hotloop.registry` (``problems``, ``models``,
``hparams_sets``, ``optimizers``, ``lr_schedules``); the subpackages
``hotloop.problems`` and ``hotloop.models`` hold the components themselves.
"""
import os

#: oneDNN keeps 1,024 kernel primitives by default. The autotuner's interleaved candidates
#: (each with its own fp32/bf16, NCHW/channels_last convolution primitives) then evict each
#: other's, and trials time primitive re-creation instead of steps (docs/tune.md). Read by
#: oneDNN at its first primitive, so it is set here, before any; a value already set wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")

from . import registry  # noqa: E402
from .builtin import declare_builtins  # noqa: E402
from .hparams import HParams, apply_overrides, get_hparams  # noqa: E402
from .registry import Registry, RegistryError, import_user_module  # noqa: E402

declare_builtins()

__version__ = "0.1.0"
__all__ = ["HParams", "Registry", "RegistryError", "Strategy", "Trainer", "apply_overrides", "auto_strategy",
           "build_run", "get_hparams", "import_user_module", "load_model", "registry", "__version__"]

#: names imported on first use (they pull in torch and the engine)
_LAZY = {"Trainer": "hotloop.train.trainer", "Strategy": "hotloop.engine.strategy",
         "auto_strategy": "hotloop.train.plan", "build_run": "hotloop.train.build",
         "load_model": "hotloop.export"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotloop' has no attribute {name!r}")
