"""``hotloop export``: write a trained run's model as safetensors, ONNX or OpenVINO IR.

The output directory holds the model files and ``config.json`` (problem,
model, hparams, spec, graph inputs/outputs, file digests). Load it back with
``hotloop.load_model`` (safetensors) or ``hotloop.export.load_runtime``
(ONNX Runtime / OpenVINO). ONNX and OpenVINO graphs are checked against
eager PyTorch (max abs diff <= 1e-4) before they are written. Seq2seq models
with incremental decoding also get an ``encoder`` and a one-step
``decoder_step`` graph with cache inputs/outputs (``hotloop.export.load_decoder``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "export"
HELP = "export a trained model as safetensors, ONNX or OpenVINO IR"
RUN_FLAGS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default=None, help="run directory (uses its best, else latest checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint file")
    parser.add_argument("--which", choices=("best", "latest"), default="best")
    parser.add_argument("--format", choices=("safetensors", "onnx", "openvino"), default="onnx")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="export directory (default: <run dir>/export/<format>)")
    parser.add_argument("--exporter", choices=("auto", "dynamo", "torchscript"), default="auto",
                        help="ONNX exporter: auto = dynamo, TorchScript for recurrent models or as the fallback")
    parser.add_argument("--graphs", default="forward,encoder,decoder_step",
                        help="graphs to write (onnx/openvino): forward; encoder and decoder_step for seq2seq "
                             "models with incremental decoding")
    parser.add_argument("--task", default=None, metavar="PROBLEM",
                        help="multi-problem runs (onnx/openvino): the problem whose graphs are written")


def run(args: argparse.Namespace) -> int:
    from ..export import export_checkpoint
    from ..compose.restore import find_checkpoint
    checkpoint = find_checkpoint(args.output_dir, args.checkpoint, which=args.which)
    run_dir = Path(args.output_dir) if args.output_dir else checkpoint.parent.parent
    out = Path(args.out) if args.out else run_dir / "export" / args.format
    graphs = [g for g in getattr(args, "graphs", "forward,encoder,decoder_step").split(",") if g]
    result = export_checkpoint(checkpoint, args.format, out, exporter=getattr(args, "exporter", "auto"),
                               graphs=graphs, task=getattr(args, "task", None))
    how = f" with the {result.exporter} exporter" if result.exporter else ""
    diff = f", max abs diff vs eager {result.max_abs_diff:.2g}" if result.max_abs_diff is not None else ""
    print(f"exported {checkpoint} as {args.format}{how} to {out}{diff}")
    for name in result.files:
        print(f"  {out / name}")
    return 0
