"""Hand a model on: safetensors, ONNX and OpenVINO exports, runtime loaders and the inference bench.

``export_checkpoint(path, "onnx", out)`` writes a directory with the model
files and a ``config.json`` manifest; :func:`load_model` rebuilds a
safetensors export as an ``nn.Module``, :func:`load_runtime` loads an
ONNX/OpenVINO graph into ONNX Runtime or OpenVINO, and :func:`load_decoder`
gives a seq2seq export's encoder + one-step decoder graphs the model's
``start_decoding``/``decode_step`` interface (greedy and beam search run on it). The optional
dependencies (onnx, onnxscript, onnxruntime, openvino) come with
``pip install 'hotloop[export]'``; they are imported only when used.
"""
from __future__ import annotations

from .artifacts import load_model, read_manifest
from .errors import (DataDependentControlFlowError, ExportError, ExportFileError, MissingExtraError,
                     INSTALL_HINT)
from .exporting import FORMATS, GRAPHS, ExportResult, export_checkpoint, export_model
from .graphs import GraphSignature, example_inputs, forward_graph
from .runtimes import load_runtime
from .seq2seq import RuntimeDecoder, load_decoder

__all__ = ["load_model", "read_manifest", "load_runtime", "load_decoder", "RuntimeDecoder", "export_model",
           "export_checkpoint", "FORMATS", "GRAPHS",
           "ExportResult", "ExportError", "ExportFileError", "DataDependentControlFlowError",
           "MissingExtraError", "INSTALL_HINT", "GraphSignature", "forward_graph", "example_inputs"]
