"""Initialise a model's weights from another run or a published checkpoint (``--init-from``).

:func:`read_init_weights` reads one of:

- a **hotloop checkpoint** file (``step-N.ckpt``), checked against its manifest and loaded
  with ``weights_only`` (:func:`hotloop.train.checkpoint.load_checkpoint`), or a **run
  directory** (its best checkpoint that verifies, else the newest);
- a **hotloop export** directory of ``hotloop export --format safetensors`` (its
  ``config.json`` manifest; ``model.safetensors`` checked against the recorded size and sha256);
- a **Hugging Face BERT** directory: ``config.json`` (``model_type="bert"``) and
  ``model.safetensors`` (or its sharded index) or ``pytorch_model.bin`` (read with
  ``torch.load(weights_only=True)``), mapped onto hotloop's ``bert`` by
  :mod:`hotloop.models.bert_hf`; its sizes must agree with the model's hparams
  (:func:`hf_hparams` gives them, to build the model from).

:func:`init_model` copies what fits into the model: only the weights (no optimizer, step or
reader state: the run starts fresh at step 0). Partial by default: names the model lacks
(unexpected), the model's names the file lacks (missing) and tensors whose shapes differ
(e.g. a classifier for another class count: that head keeps its fresh init) are skipped and
listed in the :class:`InitReport`; ``strict=True`` makes any of them a one-line error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..hparams import HParamsError
from ..models.bert import BertHParams
from ..models.bert_hf import check_hf_config, config_disagreement, config_hparams, from_hf_state
from .checkpoint import CheckpointError, CheckpointManager, load_checkpoint
from .manifest import file_digest

__all__ = ["InitFromError", "InitWeights", "InitReport", "read_init_weights", "init_model", "hf_hparams",
           "check_init_sizes", "KINDS"]

KINDS = ("hotloop checkpoint", "hotloop export", "Hugging Face BERT")
_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_EXPORT_WEIGHTS = "model.safetensors"
Notify = Callable[[str], None]


class InitFromError(UserError, ValueError):
    """An ``--init-from`` path that cannot be read or does not fit the model; names the path."""


@dataclass
class InitWeights:
    """A state dict in the model's names, read from ``path`` (a file or directory) of ``kind``."""

    kind: str
    path: Path
    state: dict[str, Tensor]
    unused: list[str] = field(default_factory=list)      # source names with no hotloop counterpart
    hf_config: dict[str, Any] | None = None


@dataclass
class InitReport:
    """What :func:`init_model` loaded and skipped (parameter and buffer names of the model)."""

    kind: str
    path: Path
    loaded: list[str]
    missing: list[str]                 # the model's names the source lacks: left at their fresh init
    unexpected: list[str]              # the source's names the model lacks
    mismatched: list[str]              # "name: source [..] vs model [..]": left at their fresh init

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def lines(self) -> list[str]:
        total = len(self.loaded) + len(self.missing) + len(self.mismatched)
        out = [f"init-from {self.path} ({self.kind}): loaded {len(self.loaded)} of the model's {total} tensors"]
        for label, names in (("missing from the source (fresh init)", self.missing),
                             ("unexpected (not used)", self.unexpected),
                             ("shape mismatch (fresh init)", self.mismatched)):
            if names:
                out.append(f"init-from: {len(names)} {label}: {', '.join(names)}")
        return out


def _fail(path: Path, reason: str) -> InitFromError:
    return InitFromError(f"--init-from {path}: {reason}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"unreadable JSON ({' '.join(str(exc).split())[:160]})") from None


def _safetensors(path: Path) -> dict[str, Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise _fail(path, "reading safetensors needs the safetensors package (pip install safetensors)") from None
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - SafetensorError and OSError: the file is not readable
        raise _fail(path, f"not a readable safetensors file ({' '.join(str(exc).split())[:160]})") from None


def _from_checkpoint(path: Path, notify: Notify | None) -> InitWeights:
    try:
        payload = load_checkpoint(path, map_location="cpu", notify=notify)
    except CheckpointError as exc:
        raise InitFromError(f"--init-from: {exc}") from None
    state = payload.get("model")
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise _fail(path, "the checkpoint holds no model state dict")
    return InitWeights("hotloop checkpoint", path, state)


def _from_run_dir(path: Path, notify: Notify | None) -> InitWeights:
    best = CheckpointManager(path / "checkpoints", writer=False).verified("best", notify or (lambda _: None))
    if best is None:
        raise _fail(path, "the run directory has no checkpoint that verifies")
    return _from_checkpoint(best, notify)


def _from_export(path: Path, manifest: dict[str, Any]) -> InitWeights:
    if manifest.get("format") != "safetensors":
        raise _fail(path, f"holds a {manifest.get('format')!r} export; --init-from reads safetensors exports "
                          f"(hotloop export --format safetensors)")
    weights = path / _EXPORT_WEIGHTS
    expected = (manifest.get("files") or {}).get(_EXPORT_WEIGHTS)
    if not weights.is_file() or not isinstance(expected, dict):
        raise _fail(path, f"the export lacks {_EXPORT_WEIGHTS} (or its entry in config.json)")
    size, sha256 = file_digest(weights)
    if (size, sha256) != (expected.get("bytes"), expected.get("sha256")):
        raise _fail(weights, "truncated or corrupt: its size or sha256 differs from the export's record")
    return InitWeights("hotloop export", weights, _safetensors(weights))


def _hf_tensors(path: Path) -> tuple[Path, dict[str, Tensor]]:
    if (path / "model.safetensors").is_file():
        return path / "model.safetensors", _safetensors(path / "model.safetensors")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set((_read_json(index).get("weight_map") or {}).values()))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(_safetensors(path / Path(shard).name))
        return index, state
    weights = path / "pytorch_model.bin"
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - refused pickle or a damaged file
        reason = "it holds objects other than tensors; refusing to unpickle them" \
            if "weights_only" in str(exc) or "Unsupported global" in str(exc) else \
            f"torch.load failed ({' '.join(str(exc).split())[:160]})"
        raise _fail(weights, reason) from None
    if not isinstance(state, dict):
        raise _fail(weights, "not a state dict")
    return weights, state


def _from_hf(path: Path, config: Any) -> InitWeights:
    try:
        config = check_hf_config(config, f"--init-from {path / 'config.json'}")
    except HParamsError as exc:
        raise InitFromError(str(exc)) from None
    if not any((path / name).is_file() for name in _HF_WEIGHTS):
        raise _fail(path, f"config.json but no weights ({', '.join(_HF_WEIGHTS)})")
    weights, raw = _hf_tensors(path)
    state, unused = from_hf_state(raw)
    return InitWeights("Hugging Face BERT", weights, state, unused, config)


def read_init_weights(path: str | Path, notify: Notify | None = None) -> InitWeights:
    """The weights at ``path`` in hotloop's names (see the module docstring for the formats)."""
    path = Path(path)
    if not path.exists():
        raise _fail(path, "no such file or directory")
    if path.is_file():
        if path.name in _HF_WEIGHTS + ("config.json",):
            path = path.parent
        else:
            return _from_checkpoint(path, notify)
    if (path / "checkpoints").is_dir():
        return _from_run_dir(path, notify)
    config_file = path / "config.json"
    if config_file.is_file():
        config = _read_json(config_file)
        if isinstance(config, dict) and "hotloop_export" in config:
            return _from_export(path, config)
        return _from_hf(path, config)
    raise _fail(path, "not a hotloop checkpoint, run directory, safetensors export or Hugging Face BERT "
                      "directory (no checkpoints/ or config.json in it)")


def hf_hparams(path: str | Path) -> dict[str, Any]:
    """The bert hparams a Hugging Face directory's ``config.json`` describes (sizes, activation,
    dropout rates, init range); {} for the other formats (their sizes come with their hparams)."""
    path = Path(path)
    folder = path.parent if path.is_file() else path
    config_file = folder / "config.json"
    if not config_file.is_file() or (folder / "checkpoints").is_dir():
        return {}
    config = _read_json(config_file)
    if isinstance(config, dict) and "hotloop_export" in config:
        return {}
    try:
        return config_hparams(check_hf_config(config, f"--init-from {config_file}"))
    except HParamsError as exc:
        raise InitFromError(str(exc)) from None


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """Names of the model's state entries that share storage with another entry (tied weights)."""
    by_storage: dict[tuple[int, int, tuple[int, ...]], set[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if t.device.type != "meta" and t.numel():
            by_storage.setdefault((t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)),
                                  set()).add(name)
    return {name: names - {name} for names in by_storage.values() if len(names) > 1 for name in names}


def check_init_sizes(weights: InitWeights, hp: Any, spec: Any = None) -> None:
    """Hugging Face weights: their config's sizes must be the hparams' (and with ``spec``, the
    vocabulary size and pad id the problem's); a one-line :class:`InitFromError` naming the field."""
    if weights.hf_config is None:
        return
    if not isinstance(hp, BertHParams):
        raise _fail(weights.path, f"Hugging Face BERT weights load into hotloop's bert model "
                                  f"(BertHParams), not one with {type(hp).__name__}")
    problem = config_disagreement(weights.hf_config, hp, spec)
    if problem:
        raise _fail(weights.path.parent, f"{problem} (take the checkpoint's sizes with "
                                         f"--init-hparams-from-config, or set them with --override)")


def init_model(model: nn.Module, path: str | Path | InitWeights, *, strict: bool = False,
               notify: Notify | None = None) -> InitReport:
    """Copy the weights at ``path`` (or already read by :func:`read_init_weights`) into ``model``
    (in place) and report what was loaded.

    ``strict``: missing, unexpected or mismatched tensors are an :class:`InitFromError` (nothing
    is copied); otherwise they are skipped and listed. Raises :class:`InitFromError` naming the
    path for an unreadable or foreign file and for Hugging Face sizes that differ from the hparams.
    """
    weights = path if isinstance(path, InitWeights) else read_init_weights(path, notify)
    check_init_sizes(weights, getattr(model, "hp", None), getattr(model, "spec", None))
    own = model.state_dict()
    fits = {n: v for n, v in weights.state.items() if n in own and tuple(own[n].shape) == tuple(v.shape)}
    mismatched = sorted(f"{n}: source {list(v.shape)} vs model {list(own[n].shape)}"
                        for n, v in weights.state.items() if n in own and n not in fits)
    unexpected = sorted(weights.unused + [n for n in weights.state if n not in own])
    aliases = _aliases(model)
    covered = set(fits) | {a for n in fits for a in aliases.get(n, ())}
    shape_names = {m.split(":")[0] for m in mismatched}
    missing = [n for n in own if n not in covered and n not in shape_names]
    report = InitReport(weights.kind, weights.path, sorted(fits), missing, unexpected, mismatched)
    if strict and not report.complete:
        problems = [f"{len(v)} {k} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
                    for k, v in (("missing", missing), ("unexpected", unexpected), ("mismatched", mismatched)) if v]
        raise _fail(weights.path, f"strict loading: {'; '.join(problems)} (drop --init-strict to load what fits)")
    with torch.no_grad():
        model.load_state_dict(fits, strict=False)
    return report
