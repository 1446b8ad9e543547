"""Inference speed of each runtime against eager PyTorch, parity-checked (``hotloop bench``).

    PYTHONPATH=. nice -n 10 python benchmarks/inference.py [--models transformer,conv_net] [--json out.json]

A thin wrapper over :mod:`hotloop.cli.bench` with the defaults the issue asks
for: ``transformer``, ``lstm_lm``, ``conv_net`` (and the zoo models that
export) at batch 1 and 32, every contender available on this machine (torch
eager, torch.compile, ONNX Runtime CPU/CUDA/TensorRT, OpenVINO f32 and bf16).
Every ``hotloop bench`` flag passes through (``--json FILE`` writes the rows).
"""
from __future__ import annotations

import argparse
import sys

import hotloop  # noqa: F401 - declares registry names
from hotloop.cli import bench

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from hotloop.tools.hardware import machine_header
    print(machine_header("benchmarks/inference.py"), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_arguments(parser)
    return bench.run(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
