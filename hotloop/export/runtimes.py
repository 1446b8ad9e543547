"""Load exported graphs into ONNX Runtime or OpenVINO, with errors that name the file.

A *runner* is a callable ``runner(list of numpy arrays in the graph's input
order) -> list of numpy arrays in its output order``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .artifacts import read_manifest, verify_file
from .errors import ExportError, ExportFileError, require

__all__ = ["Runner", "load_onnx_session", "onnx_providers", "onnx_runner", "openvino_core", "openvino_bf16",
           "openvino_runner", "load_runtime", "RUNTIMES", "OV_PRECISIONS"]

RUNTIMES = ("onnxruntime", "openvino")
OV_PRECISIONS = {"fp32": "f32", "bf16": "bf16"}
_GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@dataclass
class Runner:
    """A loaded graph: ``runner(inputs) -> outputs`` (numpy arrays, graph order)."""

    runtime: str
    precision: str
    call: Callable[[Sequence[np.ndarray]], list[np.ndarray]]
    provider: str = ""

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.call(inputs)


def _detail(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:240] or type(exc).__name__


def onnx_providers(ort: Any = None) -> list[str]:
    """Execution providers to try, best first: TensorRT and CUDA when this build has them, then CPU."""
    ort = ort or require("onnxruntime", "ONNX Runtime")
    available = set(ort.get_available_providers())
    return [p for p in _GPU_PROVIDERS if p in available] + ["CPUExecutionProvider"]


def load_onnx_session(path: str | Path, *, providers: Sequence[str] = ("CPUExecutionProvider",),
                      threads: int = 0, ort_module: Any = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path``; a bad file raises :class:`ExportFileError`."""
    ort = ort_module or require("onnxruntime", "ONNX Runtime")
    path = Path(path)
    if not path.is_file():
        raise ExportFileError(path, "missing")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), options, providers=list(providers))
    except Exception as exc:  # noqa: BLE001 - InvalidProtobuf, Fail, ...: the file is not usable
        raise ExportFileError(path, f"not a loadable ONNX model (truncated or corrupt?): {_detail(exc)}") from None


def _feeds(names: Sequence[str], inputs: Sequence[np.ndarray], accepted: set[str]) -> dict[str, np.ndarray]:
    """Inputs by name; a graph input the exporter pruned (unused by the graph) is not fed."""
    return {name: value for name, value in zip(names, inputs, strict=True) if name in accepted}


def onnx_runner(path: str | Path, *, provider: str = "CPUExecutionProvider", threads: int = 0,
                input_names: Sequence[str] | None = None) -> Runner:
    """Run ``path`` with one ONNX Runtime execution provider (CPU as the fallback).

    ``input_names`` is the order the runner's inputs come in (the graph's own order by default).
    """
    providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    session = load_onnx_session(path, providers=providers, threads=threads)
    accepted = {i.name for i in session.get_inputs()}
    names = list(input_names) if input_names is not None else [i.name for i in session.get_inputs()]

    def call(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return session.run(None, _feeds(names, inputs, accepted))

    return Runner("onnxruntime", "fp32", call, session.get_providers()[0])


def openvino_core() -> Any:
    ov = require("openvino", "OpenVINO")
    return ov.Core()


def openvino_bf16(core: Any = None) -> bool:
    """Whether OpenVINO's CPU plugin can run bf16 on this machine (AVX512-BF16 or AMX)."""
    core = core or openvino_core()
    try:
        return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # noqa: BLE001 - an unknown device/property means no
        return False


def openvino_runner(path: str | Path, *, precision: str = "fp32", threads: int = 0, core: Any = None,
                    input_names: Sequence[str] | None = None) -> Runner:
    """Compile ``path`` (``.xml`` IR or ``.onnx``) for the CPU with an explicit inference precision.

    ``INFERENCE_PRECISION_HINT`` is always set: left alone, OpenVINO runs bf16
    on CPUs with AMX/AVX512-BF16 even for an f32 model. At fp32, dynamic quantization is off
    too (``DYNAMIC_QUANTIZATION_GROUP_SIZE=0``): fp32 means fp32 on every ISA.
    """
    if precision not in OV_PRECISIONS:
        raise ExportError(f"unknown OpenVINO precision {precision!r}; choose one of {list(OV_PRECISIONS)}")
    core = core or openvino_core()
    path = Path(path)
    if not path.is_file():
        raise ExportFileError(path, "missing")
    try:
        model = core.read_model(str(path))
    except Exception as exc:  # noqa: BLE001 - a truncated .xml/.bin or a corrupt .onnx
        raise ExportFileError(path, f"not a loadable OpenVINO/ONNX model (truncated or corrupt?): "
                                    f"{_detail(exc)}") from None
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": OV_PRECISIONS[precision], "PERFORMANCE_HINT": "LATENCY"}
    if precision == "fp32":     # left alone, OpenVINO quantizes fully connected inputs to 8 bits per
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0        # group on some CPUs (seen under AVX2)
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    try:
        compiled = core.compile_model(model, "CPU", config)
    except Exception as exc:  # noqa: BLE001 - e.g. weights that do not fit the graph
        raise ExportFileError(path, f"OpenVINO cannot compile it: {_detail(exc)}") from None
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)
    accepted = {name for port in compiled.inputs for name in port.get_names()}

    def call(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds: Any = list(inputs) if input_names is None else _feeds(input_names, inputs, accepted)
        result = request.infer(feeds)
        # copies: the request may reuse its output buffers on the next call (a decoder's cache
        # from step t must survive step t + 1)
        return [np.array(result[port], copy=True) for port in outputs]

    return Runner("openvino", precision, call, "CPU")


def load_runtime(export_dir: str | Path, runtime: str = "onnxruntime", *, graph: str = "forward",
                 precision: str = "fp32", threads: int = 0) -> Runner:
    """A runner for graph ``graph`` of an ONNX or OpenVINO export directory (files checked first)."""
    if runtime not in RUNTIMES:
        raise ExportError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    if graph not in manifest["graphs"]:
        raise ExportError(f"{export_dir} has no graph {graph!r} (it has {', '.join(manifest['graphs']) or 'none'}); "
                          f"export with --format onnx or openvino")
    entry = manifest["graphs"][graph]
    for name in entry.get("files", [entry["file"]]):
        verify_file(export_dir, manifest, name)
    path = export_dir / entry["file"]
    if runtime == "onnxruntime":
        if path.suffix != ".onnx":
            raise ExportError(f"{path} is an OpenVINO IR; ONNX Runtime needs an ONNX export (--format onnx)")
        return onnx_runner(path, threads=threads, input_names=entry["inputs"])
    return openvino_runner(path, precision=precision, threads=threads, input_names=entry["inputs"])
