"""Export a model (or a trained run's checkpoint) as safetensors, ONNX or OpenVINO IR.

Each format writes one directory: the model files plus ``config.json`` (see
:mod:`hotloop.export.artifacts`). ONNX and OpenVINO graphs are checked against
eager PyTorch on inputs of other sizes than the export example before the
manifest is written.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..hparams import HParamsError
from ..problems.base import PAD_ID
from ..registry import RegistryError
from .artifacts import MANIFEST, make_manifest, save_safetensors, write_manifest
from .errors import ExportError, require
from .graphs import GraphSignature, example_inputs, forward_graph, inference_form
from .onnx_export import export_onnx, max_abs_diff
from .seq2seq import cache_init, seq2seq_graphs, supports_incremental

__all__ = ["FORMATS", "GRAPHS", "ExportResult", "export_model", "export_checkpoint", "load_for_export",
           "check_inputs_for",
           "FP32_TOL"]

FORMATS = ("safetensors", "onnx", "openvino")
GRAPHS = ("forward", "encoder", "decoder_step")
FP32_TOL = 1e-4


@dataclass
class ExportResult:
    """Where an export went and what made it."""

    out_dir: Path
    format: str
    files: list[str]
    exporter: str = ""
    notes: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None


def check_inputs_for(model: nn.Module) -> list[tuple[Tensor, ...]]:
    """Inputs of other batch/sequence sizes than the export example (seq2seq sources padded at the tail)."""
    checks = [example_inputs(model, 1, 7, seed=1), example_inputs(model, 3, 3, seed=2)]
    if model.spec.task == "seq2seq":
        src = checks[0][0].clone()                   # [1, S]
        if src.shape[1] > 2:
            src[0, -2:] = PAD_ID
        checks[0] = (src, *checks[0][1:])
    return checks


@contextlib.contextmanager
def _staged(out_dir: Path) -> Iterator[Path]:
    """A fresh sibling directory that replaces ``out_dir`` only once the export has succeeded."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir} is a file; give a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise ExportError(f"--out {out_dir} exists and is not an export directory; choose a new or empty one")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    stage.chmod(0o755)
    if out_dir.exists():
        shutil.rmtree(out_dir)     # an earlier export (or an empty directory) is replaced as a whole
    stage.rename(out_dir)


@dataclass
class _Job:
    """One graph to export: the file stem, the module and its inputs."""

    name: str
    stem: str
    module: nn.Module
    signature: GraphSignature
    example: tuple[Tensor, ...]
    checks: list[tuple[Tensor, ...]]


def _jobs(model: nn.Module, graphs: Sequence[str]) -> list[_Job]:
    unknown = sorted(set(graphs) - set(GRAPHS))
    if unknown:
        raise ExportError(f"unknown graph(s) {', '.join(unknown)}; choose from {', '.join(GRAPHS)}")
    jobs = []
    if "forward" in graphs:
        graph, sig = forward_graph(model)
        jobs.append(_Job("forward", "model", graph, sig, example_inputs(model), check_inputs_for(model)))
    if supports_incremental(model) and ({"encoder", "decoder_step"} & set(graphs)):
        for name, job in seq2seq_graphs(model).items():
            if name in graphs:
                jobs.append(_Job(name, name, job.module, job.signature, job.example, job.checks))
    if not jobs:
        raise ExportError(f"model {type(model).__name__} has none of the graphs {', '.join(graphs)} "
                          f"(encoder/decoder_step need a seq2seq model with incremental decoding)")
    return jobs


def _onnx_into(job: _Job, out_dir: Path, exporter: str, log: Callable[[str], None]) -> tuple[Any, list[str]]:
    result = export_onnx(job.module, job.example, job.signature, out_dir / f"{job.stem}.onnx", exporter=exporter,
                         check_inputs=job.checks, tol=FP32_TOL, log=log)
    files = sorted(p.name for p in out_dir.iterdir() if p.name.startswith(f"{job.stem}.onnx"))
    return result, files


def _openvino_into(job: _Job, out_dir: Path, exporter: str, log: Callable[[str], None]) -> tuple[Any, list[str]]:
    ov = require("openvino", "OpenVINO export")
    from .runtimes import openvino_runner
    xml = out_dir / f"{job.stem}.xml"
    with tempfile.TemporaryDirectory(prefix="hotloop-export-") as tmp:
        result, _ = _onnx_into(job, Path(tmp), exporter, log)
        ov.save_model(ov.convert_model(str(result.path)), str(xml), compress_to_fp16=False)
    runner = openvino_runner(xml, precision="fp32", input_names=job.signature.inputs)
    worst = 0.0
    for inputs in job.checks:
        with torch.no_grad():
            ref = job.module(*inputs)
        diff = max_abs_diff(ref if isinstance(ref, tuple) else (ref,), runner([t.numpy() for t in inputs]))
        if not diff <= FP32_TOL:
            raise ExportError(f"the OpenVINO IR of graph {job.name!r} differs from eager by {diff:.3g} > "
                              f"{FP32_TOL:g} (f32)")
        worst = max(worst, diff)
    result.max_abs_diff = max(worst, result.max_abs_diff or 0.0)
    result.path = xml
    return result, [xml.name, xml.with_suffix(".bin").name]


def export_model(model: nn.Module, fmt: str, out_dir: str | Path, *, model_name: str, problem_name: str = "",
                 exporter: str = "auto", graphs: Sequence[str] = GRAPHS, source: str = "",
                 task: str | None = None, log: Callable[[str], None] = print) -> ExportResult:
    """Write ``model`` (a registered model, any mode) to ``out_dir`` in format ``fmt``.

    ONNX/OpenVINO write each of ``graphs`` the model has: ``forward`` always,
    ``encoder`` and ``decoder_step`` for seq2seq models with incremental decoding.
    A multi-problem model (one with ``task_view``) writes the graphs of one ``task``
    (optional when it has one task); safetensors holds the whole model.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    _check_task(model, fmt, task)
    out_dir = Path(out_dir)
    if any(p.device.type != "cpu" for p in model.parameters()):
        model = copy.deepcopy(model).cpu()     # export on the CPU; the caller's model stays where it is
    model = model.eval()
    with _staged(out_dir) as stage:
        result = _write(model, fmt, stage, model_name=model_name, problem_name=problem_name, exporter=exporter,
                        graphs=graphs, source=source, task=task, log=log)
    result.out_dir = out_dir
    return result


def _check_task(model: nn.Module, fmt: str, task: str | None) -> None:
    """A clear error for ``task`` given to a one-problem model or a safetensors export, or left
    out for a multi-problem model with several tasks."""
    tasks = sorted(getattr(model, "task_specs", {})) if hasattr(model, "task_view") else []
    if task is not None and not tasks:
        raise ExportError(f"--task selects one problem of a multi-problem model; {type(model).__name__} "
                          f"trains one problem")
    if task is not None and fmt == "safetensors":
        raise ExportError("--task applies to graph exports (onnx, openvino); a safetensors export holds "
                          "the whole multi-problem model")
    if task is None and len(tasks) > 1 and fmt != "safetensors":
        raise ExportError(f"a multi-problem model exports the graphs of one task: pass --task "
                          f"(one of {', '.join(tasks)})")


def _graph_model(model: nn.Module, task: str | None) -> tuple[nn.Module, str | None]:
    """The module whose graphs are written, and its task (multi-problem models only)."""
    if not hasattr(model, "task_view"):
        return model, None
    name = task if task is not None else next(iter(model.task_specs))
    return model.task_view(name), name


def _write(model: nn.Module, fmt: str, out_dir: Path, *, model_name: str, problem_name: str, exporter: str,
           graphs: Sequence[str], source: str, task: str | None, log: Callable[[str], None]) -> ExportResult:
    manifest = make_manifest(fmt, model, model_name=model_name, problem_name=problem_name, source=source)
    if fmt == "safetensors":
        save_safetensors(model, out_dir, manifest)
        return ExportResult(out_dir, fmt, [MANIFEST, "model.safetensors"])
    model, task = _graph_model(inference_form(model), task)
    if task is not None:
        manifest["task"] = {"name": task, "spec": dataclasses.asdict(model.spec)}
    into = _onnx_into if fmt == "onnx" else _openvino_into
    files: list[str] = []
    exporters: list[str] = []
    notes: list[str] = []
    worst = 0.0
    for job in _jobs(model, graphs):
        result, job_files = into(job, out_dir, exporter, log)
        manifest["graphs"][job.name] = {"file": result.path.name, "files": job_files,
                                        **result.signature.to_dict(), "exporter": result.exporter,
                                        "max_abs_diff": result.max_abs_diff}
        files += job_files
        exporters += [result.exporter] if result.exporter not in exporters else []
        notes += [f"{job.name}: {note}" for note in result.notes]
        worst = max(worst, result.max_abs_diff or 0.0)
    if {"encoder", "decoder_step"} <= set(manifest["graphs"]):
        manifest["decoding"] = {"cache_init": cache_init(model), "max_decode_length": model.max_decode_length}
    manifest["exporter_notes"] = notes
    manifest["files"] = {name: {} for name in files}
    write_manifest(out_dir, manifest)
    return ExportResult(out_dir, fmt, [MANIFEST, *files], ",".join(exporters), notes, worst)


def load_for_export(output_dir: str | Path | None = None, checkpoint: str | Path | None = None, *,
                    which: str = "best") -> Any:
    """The trained run (``TrainedRun``) of a checkpoint, without reading or preparing data.

    An unregistered problem, model or hparams class (a user module not
    imported) raises :class:`ExportError` that asks for ``--import``.
    """
    from ..registry import models, problems
    from ..train.checkpoint import load_checkpoint
    from ..compose.restore import find_checkpoint, load_trained
    path = find_checkpoint(output_dir, checkpoint, which=which)
    try:
        return load_trained(path, device="cpu", prepare=False)
    except (RegistryError, HParamsError) as exc:
        recorded = load_checkpoint(path)["meta"].get("run") or {}
        missing = [f"{kind} {recorded[kind]!r}" for kind, registry in (("problem", problems), ("model", models))
                   if recorded.get(kind) and recorded[kind] not in registry]
        what = " and ".join(missing) or " ".join(str(exc).split())[:200]
        raise ExportError(f"checkpoint {path} needs {what}, which is not registered here; pass --import MODULE "
                          f"(the module or .py file that registers it)") from None


def export_checkpoint(checkpoint: str | Path, fmt: str, out_dir: str | Path, *, exporter: str = "auto",
                      graphs: Sequence[str] = GRAPHS, task: str | None = None,
                      log: Callable[[str], None] = print) -> ExportResult:
    """Export the model of a ``hotloop train`` checkpoint (no data is read or prepared)."""
    run = load_for_export(checkpoint=checkpoint)
    return export_model(run.model, fmt, out_dir, model_name=run.run_info["model"],
                        problem_name=run.run_info["problem"], exporter=exporter, graphs=graphs, source=str(checkpoint),
                        task=task, log=log)
