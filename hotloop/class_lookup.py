"""Resolve a class named by a file (``"module:Name"``) without letting the file choose code.

Checkpoints and export manifests record their hparams class as
``"module:Qualname"`` (:func:`hotloop.hparams.hparams_to_dict`). Importing that
module would run its top-level code, so a checkpoint from someone else could
run anything importable. :func:`resolve_hparams_class` therefore never imports
the named module. It accepts only

* an :class:`~hotloop.hparams.HParams` subclass that is already defined in this
  process: hotloop's own, those of the modules the user passed with
  ``--import`` (imported before any file is read) or defined by the user's own
  program; and
* the hparams class of a *registered* component: when the named module is one
  of hotloop's built-in registry entries not yet imported, the entry is loaded
  through its registry (code that hotloop itself names, never the file).

Anything else raises :class:`UnknownClassError` (an
:class:`~hotloop.hparams.HParamsError`, so a one-line
:class:`~hotloop.errors.UserError`) before any import.
"""
from __future__ import annotations

from typing import Iterator

from .hparams import HParams, HParamsError

__all__ = ["UnknownClassError", "resolve_hparams_class", "defined_hparams_classes"]

#: registries whose built-in entries may define hparams classes (a model's ``hparams_class``,
#: a problem's hparams, an hparams set's return type)
_REGISTRY_NAMES = ("models", "problems", "hparams")


class UnknownClassError(HParamsError):
    """A class named by a file that hotloop's registries and ``--import`` modules do not define."""


def defined_hparams_classes() -> Iterator[type[HParams]]:
    """``HParams`` and every subclass defined so far (each once, diamonds included)."""
    seen: set[type] = set()
    stack: list[type] = [HParams]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        stack.extend(cls.__subclasses__())


def _find(module: str, qualname: str) -> type[HParams] | None:
    """The defined class with this module and qualified name (the latest one when re-defined)."""
    found = None
    for cls in defined_hparams_classes():
        if cls.__module__ == module and cls.__qualname__ == qualname:
            found = cls
    return found


def _load_registered(module: str, qualname: str) -> type[HParams] | None:
    """Import the not-yet-loaded built-in registry entries in ``module`` and look again.

    A hotloop module (``hotloop.*``) that is no registry entry itself (a shared
    hparams module such as ``hotloop.problems.translation``) is reached by loading
    the model and problem entries in turn, stopping at the first that defines it.
    """
    from .registry import ALL_REGISTRIES
    registries = [ALL_REGISTRIES[name] for name in _REGISTRY_NAMES]
    pending = [(registry, name, target) for registry in registries
               for name, target in registry.lazy_targets().items()]
    exact = [entry for entry in pending if entry[2] == module]
    rest = [entry for entry in pending if entry[2] != module and entry[0] is not ALL_REGISTRIES["hparams"]]
    for registry, name, _ in exact + (rest if module.split(".")[0] == "hotloop" else []):
        try:
            registry.get(name)
        except Exception:  # noqa: BLE001 - an entry with a missing optional dependency cannot define it
            continue
        found = _find(module, qualname)
        if found is not None:
            return found
    return None


def resolve_hparams_class(qual: str) -> type[HParams]:
    """The ``HParams`` class named ``"module:Qualname"``, found without importing from the name."""
    if not isinstance(qual, str) or qual.count(":") != 1:
        raise UnknownClassError(f"hparams class {qual!r} is not of the form 'module:Name'")
    module, _, qualname = qual.partition(":")
    if not module or not qualname:
        raise UnknownClassError(f"hparams class {qual!r} is not of the form 'module:Name'")
    found = _find(module, qualname)
    if found is None:
        found = _load_registered(module, qualname)
    if found is None:
        raise UnknownClassError(
            f"hparams class {qual} is not one hotloop knows (not the hparams of a registered model, problem "
            f"or hparams set, nor defined by a module given with --import); a file cannot choose code to run, "
            f"so {module!r} was not imported: if you trust it, pass --import {module}")
    return found
