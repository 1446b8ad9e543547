"""Export a graph module to ONNX and check the file against eager PyTorch.

The dynamo exporter (``torch.export``) is tried first. Models with recurrent
``nn.RNNBase`` layers go to the TorchScript exporter directly, because the
dynamo exporter unrolls the recurrence over the example's number of steps;
any other dynamo failure falls back to TorchScript with the reason logged.
Data-dependent Python control flow is an error in both: the dynamo exporter
cannot capture it and a TorchScript trace would freeze the branch that the
example input happens to take.

Every exported file is run with ONNX Runtime on inputs of other batch and
sequence sizes than the example and compared with eager (``tol``): a graph
that baked in a shape or a branch is rejected, not written silently.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import linecache
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from .errors import DataDependentControlFlowError, ExportError, MissingExtraError, require
from .graphs import GraphSignature

__all__ = ["OnnxExport", "export_onnx", "EXPORTERS", "max_abs_diff"]

EXPORTERS = ("auto", "dynamo", "torchscript")
OPSET = 18
_LARGE_BYTES = 1_800_000_000          # above this, weights go to an external data file (2 GB protobuf limit)
_FALLBACK_ADVICE = ("rewrite it with tensor ops (torch.where, masking) or torch.cond; the TorchScript "
                    "fallback would record only the branch the example input takes, so it is not used")
_TORCH_DIR = str(Path(torch.__file__).parent)
_TRACE_BRANCH = re.compile(r"Converting a tensor to a Python (boolean|number|index|integer)")
_SHAPE_READ = re.compile(r"\.shape\b|\bsize\(|\blen\(|\.dim\(|\.numel\(")   # a shape check, not a value


@dataclass
class OnnxExport:
    """An exported ONNX file, the exporter that made it and why others were skipped."""

    path: Path
    signature: GraphSignature
    exporter: str
    notes: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None   # worst ONNX Runtime vs eager difference on the check inputs


def max_abs_diff(reference: Sequence[Tensor], outputs: Sequence[object]) -> float:
    """Largest absolute difference between matching tensors/arrays (inf on a shape mismatch)."""
    worst = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        got = torch.as_tensor(out).to(torch.float32)
        if tuple(got.shape) != tuple(ref.shape):
            return float("inf")
        worst = max(worst, (got - ref.detach().float().cpu()).abs().max().item() if ref.numel() else 0.0)
    return worst


def _as_tuple(out: object) -> tuple[Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)  # type: ignore[arg-type]


def _has_recurrence(module: nn.Module) -> bool:
    return any(isinstance(m, nn.RNNBase) for m in module.modules())


@contextlib.contextmanager
def _quiet() -> object:
    """Silence the exporters' progress prints, warnings and log lines (failures still raise)."""
    loggers = [logging.getLogger(n) for n in ("torch", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _data_dependent_site(exc: BaseException) -> str | None:
    """'file:line (`code`), op ...' when ``exc`` (or a cause) is a data-dependent guard failure."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = "\n".join(str(e) for e in chain)
    names = {type(e).__name__ for e in chain}
    if not ({"GuardOnDataDependentSymNode", "DataDependentOutputException"} & names
            or "data-dependent" in text or "Dynamic control flow" in text):
        return None
    match = re.search(r'File "([^"]+)", line (\d+), in (\w+)\n\s+(.+)', text)
    op_match = re.search(r"aten\.\w+", text)
    op = op_match.group(0) if op_match else "aten.item"
    where = (f"{Path(match.group(1)).name}:{match.group(2)} in {match.group(3)} (`{match.group(4).strip()}`)"
             if match else "in the model's forward")
    return f"{where}, op {op} (a tensor value read as a Python bool or number)"


def _reason(exc: BaseException) -> str:
    """One line: the exporter's own exception summary when it has one."""
    text = str(exc)
    if "Exception summary" in text:
        lines = [ln.strip() for ln in text.split("Exception summary", 1)[1].splitlines() if ln.strip()]
        text = lines[0] if lines else text
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())[:300] or type(exc).__name__


def _dynamo(module: nn.Module, args: tuple[Tensor, ...], sig: GraphSignature, path: Path, opset: int) -> None:
    dims: dict[str, object] = {}
    shapes = []
    for name in sig.inputs:
        axes = sig.dynamic_axes.get(name, {})
        shapes.append({axis: dims.setdefault(dim, torch.export.Dim(dim)) for axis, dim in axes.items()} or None)
    params = inspect.signature(module.forward).parameters.values()
    fixed = sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                for p in params)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params) and len(shapes) > fixed:
        shapes = [*shapes[:fixed], tuple(shapes[fixed:])]      # forward(a, b, *rest): rest is one tuple
    big = sum(p.numel() * p.element_size() for p in module.parameters()) > _LARGE_BYTES
    torch.onnx.export(module, args, str(path), dynamo=True, input_names=sig.inputs, output_names=sig.outputs,
                      dynamic_shapes=tuple(shapes), opset_version=opset, verbose=False, optimize=True,
                      external_data=big)


def _torchscript(module: nn.Module, args: tuple[Tensor, ...], sig: GraphSignature, path: Path,
                 opset: int) -> list[str]:
    """Trace and export; returns the sites in user code where the trace read a tensor value (not a
    shape) as a Python value."""
    mha = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)   # the fused attention kernels have no ONNX symbolic
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=sig.inputs,
                              output_names=sig.outputs, dynamic_axes=sig.dynamic_axes, opset_version=opset)
    finally:
        torch.backends.mha.set_fastpath_enabled(mha)
    sites = []
    for w in caught:
        if _TRACE_BRANCH.search(str(w.message)) and not w.filename.startswith(_TORCH_DIR):
            code = linecache.getline(w.filename, w.lineno).strip()
            if not _SHAPE_READ.search(code):
                sites.append(f"{Path(w.filename).name}:{w.lineno} (`{code}`)")
    return sorted(set(sites))


def _check(module: nn.Module, sig: GraphSignature, path: Path,
           check_inputs: Sequence[tuple[Tensor, ...]], tol: float) -> float | None:
    try:
        ort = require("onnxruntime", "checking an ONNX export")
    except MissingExtraError:
        return None
    from .runtimes import load_onnx_session
    session = load_onnx_session(path, ort_module=ort)
    accepted = {i.name for i in session.get_inputs()}
    worst = 0.0
    for inputs in check_inputs:
        with torch.no_grad():
            reference = _as_tuple(module(*inputs))
        feeds = {name: t.detach().cpu().numpy() for name, t in zip(sig.inputs, inputs) if name in accepted}
        shape = "x".join(str(s) for s in inputs[0].shape)
        try:
            outputs = session.run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - a graph that cannot run this shape
            raise ExportError(f"the exported graph fails on inputs of shape {shape}: "
                              f"{' '.join(str(exc).split())[:200]}") from None
        diff = max_abs_diff(reference, outputs)
        if not diff <= tol:
            raise ExportError(f"the exported graph differs from eager on inputs of shape {shape}: "
                              f"max abs diff {diff:.3g} > {tol:g} (a shape or branch was baked in)")
        worst = max(worst, diff)
    return worst


def _attempt(name: str, module: nn.Module, args: tuple[Tensor, ...], sig: GraphSignature, path: Path,
             check_inputs: Sequence[tuple[Tensor, ...]], tol: float, opset: int, notes: list[str],
             log: Callable[[str], None]) -> OnnxExport:
    """One exporter: export, then check with ONNX Runtime (trace sites are named if the check fails)."""
    if name == "dynamo":
        require("onnxscript", "the dynamo ONNX exporter")
    sites: list[str] = []
    with torch.no_grad():
        if name == "dynamo":
            with _quiet():
                _dynamo(module, args, sig, path, opset)
        else:
            sites = _torchscript(module, args, sig, path, opset)
    try:
        diff = _check(module, sig, path, check_inputs, tol)
    except ExportError as exc:
        if not sites:
            raise
        raise DataDependentControlFlowError(
            f"{exc}; the TorchScript trace read tensor values as Python values at {', '.join(sites)}: if that "
            f"is data-dependent control flow, rewrite it with tensor ops (torch.where, masking) or torch.cond"
        ) from None
    if sites:
        notes.append(f"the TorchScript trace read tensor values as Python values at {', '.join(sites)}; the "
                     f"graph matched eager on the check inputs, but if that is data-dependent control flow it "
                     f"holds only the branch the example input took")
        log(f"export: warning: {notes[-1]}")
    return OnnxExport(path, sig, name, notes, diff)


def export_onnx(module: nn.Module, args: tuple[Tensor, ...], sig: GraphSignature, path: str | Path, *,
                exporter: str = "auto", check_inputs: Sequence[tuple[Tensor, ...]] = (), tol: float = 1e-4,
                opset: int = OPSET, log: Callable[[str], None] = print) -> OnnxExport:
    """Export ``module(*args)`` to ``path`` (see the module doc for the exporter choice and checks)."""
    require("onnx", "ONNX export")
    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    attempts = [exporter] if exporter != "auto" else ["dynamo", "torchscript"]
    if exporter == "auto" and _has_recurrence(module):
        attempts = ["torchscript"]
        notes.append("dynamo exporter skipped: it unrolls nn.LSTM/GRU/RNN over a fixed number of steps")
        log(f"export: {notes[-1]}")
    module = module.eval()
    for i, name in enumerate(attempts):
        try:
            return _attempt(name, module, args, sig, path, check_inputs, tol, opset, notes, log)
        except (DataDependentControlFlowError, MissingExtraError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - any exporter failure is reported or falls back
            site = _data_dependent_site(exc)
            if site is not None:
                raise DataDependentControlFlowError(
                    f"cannot export: data-dependent control flow at {site}; {_FALLBACK_ADVICE}") from None
            reason = _reason(exc)
            notes.append(f"{name} exporter failed: {reason}")
            if i + 1 < len(attempts):
                log(f"export: {name} exporter failed ({reason}); falling back to the {attempts[i + 1]} exporter")
                continue
            if isinstance(exc, ExportError) and len(attempts) == 1:
                raise
            raise ExportError("cannot export to ONNX: " + "; ".join(notes)) from None
    raise AssertionError("unreachable")
