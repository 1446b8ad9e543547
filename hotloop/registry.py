"""One generic name -> object registry, with clear errors (the T2T idea).

Registration is explicit: a module registers its components when it is
imported, and :func:`import_user_module` loads a user's own module by name or
path so that its registrations become visible to the CLI.
"""
from __future__ import annotations

from .errors import UserError

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable, Generic, Iterator, TypeVar

__all__ = [
    "Registry", "RegistryError", "problems", "models", "hparams_sets",
    "optimizers", "lr_schedules", "evaluators", "ALL_REGISTRIES", "import_user_module",
    "registered_name", "REGISTERED_NAME", "user_module_name", "is_imported",
]

T = TypeVar("T")

#: the attribute :meth:`Registry.add` sets on a registered class or function
REGISTERED_NAME = "registered_name"


class RegistryError(UserError, KeyError):
    """Unknown or duplicate registry name. ``str()`` is a readable message."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class _Lazy:
    """A registered name whose object lives in a module not yet imported."""

    def __init__(self, target: str) -> None:
        self.module, _, self.attr = target.partition(":")
        if not self.module or not self.attr:
            raise RegistryError(f"lazy target must be 'module:attr', got {target!r}")

    def resolve(self) -> object:
        return getattr(importlib.import_module(self.module), self.attr)


class Registry(Generic[T]):
    """A named mapping from names to components (classes, functions, sets).

    Entries are either objects (``register``/``add``) or lazy ``"module:attr"``
    targets (``add_lazy``) that are imported on first ``get``, so listing the
    built-ins imports nothing.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, object] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: ``@models.register("mlp")``; the default name is ``obj.__name__``."""
        def deco(obj: T) -> T:
            self.add(name or getattr(obj, "__name__"), obj)
            return obj
        return deco

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` under ``name`` and record the name on it (see :func:`registered_name`)."""
        if not name or not isinstance(name, str):
            raise RegistryError(f"{self.kind}: name must be a non-empty string, got {name!r}")
        existing = self._items.get(name)
        if existing is not None and not (isinstance(existing, _Lazy)
                                         and existing.module == getattr(obj, "__module__", None)):
            raise RegistryError(f"{self.kind} {name!r} is already registered "
                                f"(by {_origin(self._items[name])}); pick another name")
        self._items[name] = obj  # a lazy entry is replaced when its module registers itself
        _record_name(obj, name)

    def add_lazy(self, name: str, target: str) -> None:
        """Declare ``name`` as ``"package.module:attr"``, imported on first ``get``."""
        if name in self._items:
            raise RegistryError(f"{self.kind} {name!r} is already registered")
        self._items[name] = _Lazy(target)

    def get(self, name: str) -> T:
        try:
            item = self._items[name]
        except KeyError:
            raise RegistryError(self._unknown_message(name)) from None
        if isinstance(item, _Lazy):
            obj = item.resolve()
            if isinstance(self._items.get(name), _Lazy):  # module did not register itself
                self._items[name] = obj
                _record_name(obj, name)
            item = self._items[name]
        return item  # type: ignore[return-value]

    def _unknown_message(self, name: str) -> str:
        msg = f"unknown {self.kind} {name!r}"
        close = difflib.get_close_matches(name, list(self._items), n=1, cutoff=0.5)
        if close:
            msg += f"; did you mean {close[0]!r}?"
        known = ", ".join(sorted(self._items)) or "(none registered)"
        return msg + f" Registered {self.kind}s: {known}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def lazy_targets(self) -> dict[str, str]:
        """``name -> module`` of the lazy entries whose module is not imported yet (imports nothing)."""
        return {name: item.module for name, item in self._items.items() if isinstance(item, _Lazy)}

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def unregister(self, name: str) -> None:
        """Remove a name (used by tests and by re-importing user modules)."""
        obj = self._items.pop(name, None)
        if obj is not None and registered_name(obj) == name:
            try:
                delattr(obj, REGISTERED_NAME)
            except (AttributeError, TypeError):
                pass


def registered_name(obj: object) -> str | None:
    """The name ``obj`` was first registered under, or None.

    Only the object's own attribute counts: an unregistered subclass of a
    registered class has no registered name of its own.
    """
    try:
        own = vars(obj)
    except TypeError:  # no __dict__ (a builtin, a slotted instance)
        return None
    name = own.get(REGISTERED_NAME)
    return name if isinstance(name, str) else None


def _record_name(obj: object, name: str) -> None:
    """Set ``obj.registered_name`` unless it already has one (an alias keeps the first name)."""
    if registered_name(obj) is not None:
        return
    try:
        setattr(obj, REGISTERED_NAME, name)
    except (AttributeError, TypeError):  # builtins and slotted objects cannot carry it
        pass


def _origin(obj: object) -> str:
    if isinstance(obj, _Lazy):
        return f"{obj.module}:{obj.attr}"
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


problems: Registry = Registry("problem")
models: Registry = Registry("model")
hparams_sets: Registry = Registry("hparams set")
optimizers: Registry = Registry("optimizer")
lr_schedules: Registry = Registry("lr schedule")
#: task name (``ProblemSpec.task``) -> evaluator ``(model, reader, *, device, max_batches) -> metrics``,
#: used by :func:`hotloop.train.evaluation.evaluate_reader` instead of teacher-forced token metrics
evaluators: Registry = Registry("evaluator")
ALL_REGISTRIES: dict[str, Registry] = {
    "problems": problems, "models": models, "hparams": hparams_sets,
    "optimizers": optimizers, "lr_schedules": lr_schedules,
}


def user_module_name(spec: str) -> str:
    """The ``sys.modules`` name :func:`import_user_module` gives ``spec`` (a file's stem, a
    package directory's name, else the dotted name itself); imports nothing."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_dir() or path.exists():
        path = path.resolve()
        return path.name if path.is_dir() else path.stem
    return spec


def is_imported(spec: str) -> bool:
    """Whether the module of ``--import spec`` is already imported in this process."""
    return user_module_name(spec) in sys.modules


def import_user_module(spec: str) -> None:
    """Import a user module by dotted name or by ``.py`` file / package directory path."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_dir() or path.exists():
        path = path.resolve()
        if path.is_dir():
            init = path / "__init__.py"
            if not init.exists():
                raise ImportError(f"--import {spec}: directory has no __init__.py")
            name, file = path.name, init
            sys.path.insert(0, str(path.parent))
        elif path.exists():
            name, file = path.stem, path
        else:
            raise ImportError(f"--import {spec}: file not found")
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, file)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"--import {spec}: cannot load")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # let `--import my_module` find modules in the working directory
    importlib.import_module(spec)
