"""Inference bench: torch eager, torch.compile, ONNX Runtime and OpenVINO, parity-checked.

For each model and batch size every contender first runs the same inputs as
eager PyTorch; its outputs are compared (max abs diff over all outputs, argmax
agreement of the logits). A contender outside its tolerance (fp32:
:data:`FP32_TOL` absolute; bf16: :data:`BF16_REL_TOL` times the largest eager
logit magnitude) is reported as failed and not timed, so it can never look
fast. The others are timed interleaved (one timing of each contender per
round, after warm-up) and the medians reported.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from .bench_models import BenchSubject
from .errors import MissingExtraError
from .graphs import example_inputs

__all__ = ["Contender", "BenchRow", "default_contenders", "run_bench", "parity", "environment", "format_rows",
           "FP32_TOL", "BF16_REL_TOL", "ROW_KEYS"]

FP32_TOL = 1e-4
BF16_REL_TOL = 5e-2
ROW_KEYS = ("model", "runtime", "precision", "batch", "samples_per_s", "latency_ms", "speedup_vs_eager",
            "max_abs_diff", "parity_ok")
Runner = Callable[[Sequence[Tensor]], Sequence[Any]]


@dataclass
class Contender:
    """A way to run a subject's graph: ``make(subject, workdir, threads) -> runner(inputs) -> outputs``."""

    runtime: str
    precision: str
    make: Callable[[BenchSubject, Path, int], Runner]
    warmup: int = 3


@dataclass
class BenchRow:
    model: str
    runtime: str
    precision: str
    batch: int
    samples_per_s: float | None = None
    latency_ms: float | None = None
    speedup_vs_eager: float | None = None
    max_abs_diff: float | None = None
    parity_ok: bool = False
    argmax_agreement: float | None = None
    error: str = ""
    times: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (*ROW_KEYS, "argmax_agreement")}
        if self.error:
            out["error"] = self.error
        return out


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def parity(reference: Sequence[Tensor], outputs: Sequence[Any], precision: str) -> tuple[float, float, bool]:
    """(max abs diff, argmax agreement of the first output, within tolerance) against eager."""
    worst = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        got = torch.as_tensor(np.asarray(out, dtype=np.float32) if not isinstance(out, Tensor) else out).float()
        if tuple(got.shape) != tuple(ref.shape):
            return float("inf"), 0.0, False
        worst = max(worst, (got - ref.float()).abs().max().item() if ref.numel() else 0.0)
    logits, got = reference[0].float(), torch.as_tensor(np.asarray(outputs[0], dtype=np.float32))
    axis = 1 if logits.dim() == 4 else -1      # segmentation logits are [B, K, H, W]
    agree = (logits.argmax(axis) == got.argmax(axis)).float().mean().item()
    scale = max(1.0, logits.abs().max().item())
    tol = FP32_TOL if precision == "fp32" else BF16_REL_TOL * scale
    return worst, agree, bool(worst <= tol)


# ----------------------------------------------------------------------------- contenders
def _eager(subject: BenchSubject, workdir: Path, threads: int) -> Runner:
    graph, _ = subject.graph()
    return lambda inputs: [t for t in _as_list(graph(*inputs))]


def _compiled(subject: BenchSubject, workdir: Path, threads: int) -> Runner:
    graph, _ = subject.graph()
    compiled = torch.compile(graph)
    return lambda inputs: _as_list(compiled(*inputs))


def _onnx_file(subject: BenchSubject, workdir: Path) -> Path:
    """Export the subject once per bench (shared by the ONNX Runtime and OpenVINO contenders)."""
    path = workdir / subject.name / "model.onnx"
    if not path.is_file():
        from .exporting import check_inputs_for
        from .onnx_export import export_onnx
        graph, sig = subject.graph()
        export_onnx(graph, example_inputs(subject.model), sig, path, check_inputs=check_inputs_for(subject.model),
                    tol=FP32_TOL, log=lambda msg: print(f"  {subject.name}: {msg}"))
    return path


def _ort(provider: str) -> Callable[[BenchSubject, Path, int], Runner]:
    def make(subject: BenchSubject, workdir: Path, threads: int) -> Runner:
        from .runtimes import onnx_runner
        runner = onnx_runner(_onnx_file(subject, workdir), provider=provider, threads=threads)
        return lambda inputs: runner([t.numpy() for t in inputs])
    return make


def _openvino(precision: str) -> Callable[[BenchSubject, Path, int], Runner]:
    def make(subject: BenchSubject, workdir: Path, threads: int) -> Runner:
        from .runtimes import openvino_runner
        runner = openvino_runner(_onnx_file(subject, workdir), precision=precision, threads=threads)
        return lambda inputs: runner([t.numpy() for t in inputs])
    return make


def default_contenders(log: Callable[[str], None] = print) -> list[Contender]:
    """Eager, torch.compile, ONNX Runtime (CPU; CUDA/TensorRT when available), OpenVINO f32 (+ bf16)."""
    out = [Contender("torch", "fp32", _eager), Contender("torch.compile", "fp32", _compiled, warmup=3)]
    try:
        from .runtimes import onnx_providers
        for provider in onnx_providers():
            label = {"CPUExecutionProvider": "onnxruntime", "CUDAExecutionProvider": "onnxruntime-cuda",
                     "TensorrtExecutionProvider": "onnxruntime-tensorrt"}[provider]
            out.append(Contender(label, "fp32", _ort(provider)))
    except MissingExtraError as exc:
        log(f"skipping ONNX Runtime: {exc}")
    try:
        from .runtimes import openvino_bf16, openvino_core
        bf16 = openvino_bf16(openvino_core())
        out.append(Contender("openvino", "fp32", _openvino("fp32")))
        if bf16:
            out.append(Contender("openvino", "bf16", _openvino("bf16")))
        else:
            log("OpenVINO bf16 skipped: the CPU plugin reports no BF16 capability")
    except MissingExtraError as exc:
        log(f"skipping OpenVINO: {exc}")
    return out


# ----------------------------------------------------------------------------- measuring
def _time_once(run: Runner, inputs: Sequence[Tensor], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        run(inputs)
    return (time.perf_counter() - start) / reps


def _measure_batch(subject: BenchSubject, batch: int, runners: dict[int, Runner], contenders: list[Contender],
                   rows: list[BenchRow], rounds: int, min_round_s: float) -> None:
    inputs = example_inputs(subject.model, batch, subject.seq, seed=batch)
    reference = [t.detach() for t in runners[0](inputs)]
    live: list[tuple[BenchRow, Runner]] = []
    first = len(rows)                              # rows[first] is the eager reference's row
    for index, contender in enumerate(contenders):
        row = BenchRow(subject.name, contender.runtime, contender.precision, batch)
        rows.append(row)
        if index not in runners:
            row.error = "could not be built (see above)"
            continue
        try:
            for _ in range(max(1, contender.warmup)):
                outputs = _as_list(runners[index](inputs))
            row.max_abs_diff, row.argmax_agreement, row.parity_ok = parity(reference, outputs, contender.precision)
        except Exception as exc:  # noqa: BLE001 - a runtime that fails here is a failed row
            row.error = " ".join(str(exc).split())[:200] or type(exc).__name__
            continue
        if row.parity_ok:
            live.append((row, runners[index]))
        else:
            row.error = f"parity failed: max abs diff {row.max_abs_diff:.3g}"
    reps = {id(row): max(1, int(min_round_s / max(_time_once(run, inputs, 1), 1e-6))) for row, run in live}
    for _ in range(rounds):
        for row, run in live:                      # interleaved: every contender once per round
            row.times.append(_time_once(run, inputs, reps[id(row)]))
    eager = statistics.median(rows[first].times) if rows[first].times else None
    for row, _ in live:
        latency = statistics.median(row.times)
        row.latency_ms = latency * 1e3
        row.samples_per_s = batch / latency
        row.speedup_vs_eager = eager / latency if eager else None


def run_bench(subjects: Sequence[BenchSubject], batches: Sequence[int], *, contenders: list[Contender] | None = None,
              threads: int = 0, rounds: int = 7, min_round_s: float = 0.05,
              log: Callable[[str], None] = print) -> list[BenchRow]:
    """Measure every subject x batch x contender (the first contender is the eager reference)."""
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    contenders = contenders if contenders is not None else default_contenders(log)
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="hotloop-bench-") as tmp, torch.no_grad():
        for subject in subjects:
            runners: dict[int, Runner] = {}
            for index, contender in enumerate(contenders):
                try:
                    runners[index] = contender.make(subject, Path(tmp), threads)
                except Exception as exc:  # noqa: BLE001 - report and keep measuring the others
                    log(f"  {subject.name}: {contender.runtime} {contender.precision} unavailable: "
                        f"{' '.join(str(exc).split())[:200]}")
            if 0 not in runners:
                log(f"  {subject.name}: skipped, the eager reference ({contenders[0].runtime}) is unavailable")
                continue
            for batch in batches:
                _measure_batch(subject, batch, runners, contenders, rows, rounds, min_round_s)
    return rows


# ----------------------------------------------------------------------------- reporting
def environment(threads: int) -> dict[str, Any]:
    """CPU model, AMX / AVX512-BF16 presence, OpenVINO's bf16 capability, threads and versions."""
    from importlib.metadata import PackageNotFoundError, version
    from ..tools.hardware import detect_hardware
    hw = detect_hardware("cpu")
    env: dict[str, Any] = {"cpu": hw.cpu_model, "cores": hw.cores, "threads": threads,
                           "amx": "amx_bf16" in hw.cpu_bf16, "avx512_bf16": "avx512_bf16" in hw.cpu_bf16,
                           "torch": torch.__version__}
    for package in ("onnxruntime", "openvino"):
        try:
            env[package] = version(package)
        except PackageNotFoundError:
            env[package] = None
    try:
        from .runtimes import openvino_bf16
        env["openvino_bf16"] = openvino_bf16()
    except MissingExtraError:
        env["openvino_bf16"] = False
    return env


def format_rows(rows: Sequence[BenchRow]) -> str:
    """A fixed-width table; failed contenders show FAILED and their reason instead of a speed."""
    lines = [f"{'model':<14} {'runtime':<22} {'prec':<5} {'batch':>5} {'samples/s':>11} {'latency ms':>11} "
             f"{'vs eager':>9} {'max|diff|':>10} {'argmax':>7}"]
    for r in rows:
        diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.2g}"
        agree = "-" if r.argmax_agreement is None else f"{r.argmax_agreement:.3f}"
        head = f"{r.model:<14} {r.runtime:<22} {r.precision:<5} {r.batch:>5} "
        if r.samples_per_s is None:
            lines.append(head + f"{'FAILED':>11} {'-':>11} {'-':>9} {diff:>10} {agree:>7}  {r.error[:80]}")
        else:
            speed = "-" if r.speedup_vs_eager is None else f"{r.speedup_vs_eager:.2f}x"
            lines.append(head + f"{r.samples_per_s:>11.1f} {r.latency_ms:>11.3f} {speed:>9} {diff:>10} {agree:>7}")
    return "\n".join(lines)
