"""An export directory: its ``config.json`` manifest, safetensors weights and :func:`load_model`.

Every export directory holds ``config.json``::

    {"hotloop_export": 1, "format": "safetensors" | "onnx" | "openvino",
     "problem": str, "model": str, "hparams": {...}, "spec": {...},
     "graphs": {name: {"file", "inputs", "outputs", "dynamic_axes"}},
     "files": {file name: {"sha256", "bytes"}}, ...}

The file digests let a loader name a truncated or corrupt file instead of
failing somewhere inside a runtime.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..compose.build import build_recorded_model
from ..hparams import HParams, HParamsError, hparams_from_dict, hparams_to_dict
from ..problems.base import ProblemSpec
from ..registry import RegistryError, models
from .errors import ExportError, ExportFileError, require

__all__ = ["MANIFEST", "EXPORT_VERSION", "WEIGHTS_FILE", "make_manifest", "write_manifest", "read_manifest",
           "verify_file", "save_safetensors", "load_model", "rebuild_model"]

MANIFEST = "config.json"
EXPORT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
IMPORT_HINT = "pass --import MODULE (the module that registers it), or import it before loading"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def make_manifest(fmt: str, model: nn.Module, *, model_name: str, problem_name: str = "",
                  **extra: Any) -> dict[str, Any]:
    """The manifest fields that describe ``model`` (files and graphs are added by the writer)."""
    return {"hotloop_export": EXPORT_VERSION, "format": fmt, "problem": problem_name, "model": model_name,
            "hparams": hparams_to_dict(model.hp), "spec": dataclasses.asdict(model.spec),
            "graphs": {}, "files": {}, **extra}


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    """Record size and sha256 of every file named in ``manifest["files"]``, then write it."""
    for name in list(manifest["files"]):
        path = out_dir / name
        manifest["files"][name] = {"sha256": _digest(path), "bytes": path.stat().st_size}
    target = out_dir / MANIFEST
    target.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return target


def read_manifest(export_dir: str | Path) -> dict[str, Any]:
    """The manifest of ``export_dir``; a clear error naming the file when it is missing or unreadable."""
    path = Path(export_dir) / MANIFEST
    if not path.is_file():
        raise ExportFileError(path, "missing; not a hotloop export directory (run `hotloop export`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ExportFileError(path, f"unreadable export manifest (truncated or corrupt?): {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("hotloop_export") != EXPORT_VERSION:
        raise ExportFileError(path, f"not a hotloop export manifest of version {EXPORT_VERSION}")
    for key, kind in (("format", str), ("model", str), ("hparams", dict), ("spec", dict), ("files", dict),
                      ("graphs", dict)):
        if key not in manifest:
            raise ExportFileError(path, f"export manifest lacks {key!r} (truncated or edited?)")
        if not isinstance(manifest[key], kind):
            raise ExportFileError(path, f"export manifest's {key!r} is a {type(manifest[key]).__name__}, "
                                        f"not a {'string' if kind is str else 'mapping'} (edited?)")
    for name, entry in manifest["files"].items():
        if Path(name).name != name or not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or not isinstance(entry.get("bytes"), int):
            raise ExportFileError(path, f"export manifest's entry for {name!r} is not a file name with "
                                        f"sha256 and bytes (edited?)")
    return manifest


def verify_file(export_dir: str | Path, manifest: dict[str, Any], name: str) -> Path:
    """``export_dir/name`` after checking its size and sha256 against the manifest."""
    path = Path(export_dir) / name
    expected = manifest["files"].get(name)
    if not path.is_file():
        raise ExportFileError(path, "missing from the export directory")
    if expected is None:
        raise ExportFileError(path, f"not listed in {MANIFEST}")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise ExportFileError(path, f"truncated or corrupt: {size} bytes, the export wrote {expected['bytes']}")
    if _digest(path) != expected["sha256"]:
        raise ExportFileError(path, "corrupt: its sha256 differs from the one the export recorded")
    return path


def _spec_from_dict(fields: dict[str, Any]) -> ProblemSpec:
    """A ``ProblemSpec``, or a ``MultiProblemSpec`` with its tasks when the dict has ``tasks``."""
    if "tasks" not in fields:
        return ProblemSpec(**fields)
    from ..problems.multi_problem import MultiProblemSpec, TaskSpec
    tasks = tuple(TaskSpec(t["name"], t["index"], ProblemSpec(**t["spec"]), t["vocabulary"])
                  for t in fields["tasks"])
    return MultiProblemSpec(**{**fields, "tasks": tasks})


def rebuild_model(manifest: dict[str, Any]) -> nn.Module:
    """A freshly initialised model from the manifest's registry name, hparams and spec (no data)."""
    name = manifest["model"]
    if name not in models:
        raise ExportError(f"model {name!r} of this export is not registered; {IMPORT_HINT}")
    try:
        model_cls = models.get(name)              # first: the registered model defines its hparams class
    except RegistryError as exc:
        raise ExportError(f"{exc}; {IMPORT_HINT}") from None
    try:
        hp: HParams = hparams_from_dict(manifest["hparams"])   # never imports a module the manifest names
    except HParamsError as exc:
        raise ExportError(f"{exc}; {IMPORT_HINT}") from None
    try:
        spec = _spec_from_dict(manifest["spec"])
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ExportError(f"export spec does not fit ProblemSpec: {exc}") from None
    return build_recorded_model(model_cls, hp, spec, "cpu", f"export manifest of model {name!r}").eval()


def save_safetensors(model: nn.Module, out_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write ``model.safetensors`` (shared weights stored once) and the manifest into ``out_dir``."""
    st = require("safetensors.torch", "safetensors export")
    out_dir.mkdir(parents=True, exist_ok=True)
    st.save_model(model, str(out_dir / WEIGHTS_FILE))
    manifest["files"][WEIGHTS_FILE] = {}
    return write_manifest(out_dir, manifest)


def load_model(export_dir: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """The model of a safetensors export, in eval mode.

    Rebuilt from the registry with the saved hparams and spec (the problem's
    data is not needed) and loaded with the saved weights only (no optimizer
    or reader state). A truncated or corrupt file raises
    :class:`ExportFileError` naming it; an unregistered model asks for ``--import``.
    """
    st = require("safetensors.torch", "loading a safetensors export")
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    if manifest["format"] != "safetensors":
        raise ExportError(f"{export_dir} holds a {manifest['format']} export; load_model needs a safetensors "
                          f"export (hotloop export --format safetensors)")
    weights = verify_file(export_dir, manifest, WEIGHTS_FILE)
    model = rebuild_model(manifest)
    try:
        st.load_model(model, str(weights), strict=True)
    except Exception as exc:  # noqa: BLE001 - SafetensorError, shape mismatch: the file does not fit
        detail = " ".join(str(exc).split())[:300]
        raise ExportFileError(weights, f"cannot load the weights into model {manifest['model']!r}: {detail}") from None
    return model.to(device).eval()
