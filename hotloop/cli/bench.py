"""``hotloop bench``: inference throughput and latency of each runtime, checked against eager PyTorch.

Contenders: torch eager, torch.compile, ONNX Runtime (CPU; CUDA and TensorRT
execution providers when this onnxruntime build has them), OpenVINO f32 and,
where the CPU plugin reports BF16, OpenVINO bf16 (``INFERENCE_PRECISION_HINT``
is set explicitly for both). Models are built from the registry with random
weights (``transformer``: transformer_multi30k sizes, 24-token sentences;
``lstm_lm``: PTB small, 20 steps; ``conv_net``: 3x32x32 images; zoo models:
their problem's default hparams), or taken from a trained run
(``--output-dir``/``--checkpoint``). RUN_FLAGS is False: the bench builds its
own models, so the training flags (--problem, --hparams, ...) do not apply.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "bench"
HELP = "inference speed of torch, torch.compile, ONNX Runtime and OpenVINO, parity-checked against eager"
RUN_FLAGS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=None,
                        help="comma-separated model names (default: transformer, lstm_lm, conv_net and every "
                             "other registered model that exports)")
    parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes")
    parser.add_argument("--override", default="", help='hparams overrides "k=v,k=v" for every bench model')
    parser.add_argument("--output-dir", default=None, help="bench a trained run's model instead (best checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="bench the model of this checkpoint instead")
    parser.add_argument("--runtimes", default="all",
                        help="comma-separated contenders among torch, torch.compile, onnxruntime, onnxruntime-cuda, "
                             "onnxruntime-tensorrt, openvino (default: all available; torch eager always runs)")
    parser.add_argument("--threads", type=int, default=0, help="threads for every runtime (default: torch's)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (medians reported)")
    parser.add_argument("--json", default=None, metavar="FILE", help='write {"rows": [...], "environment": {...}}')


def _int_list(text: str, flag: str) -> list[int]:
    from ..export.errors import ExportError
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ExportError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise ExportError(f"{flag} {text!r}: expected positive integers")
    return values


def _subjects(args: argparse.Namespace) -> list:
    from ..export.bench_models import build_subject, default_model_names, subject_from_model
    if args.output_dir or args.checkpoint:
        from ..export.exporting import load_for_export
        trained = load_for_export(args.output_dir, args.checkpoint)
        return [subject_from_model(trained.run_info["model"], trained.model, note=f"checkpoint {trained.checkpoint}")]
    explicit = bool(args.models)
    names = [n for n in args.models.split(",") if n] if explicit else default_model_names()
    subjects = []
    for name in names:
        try:
            subjects.append(build_subject(name, args.override or None))
        except Exception as exc:  # noqa: BLE001 - a zoo model that cannot be built or has no graph
            if explicit:
                raise
            print(f"skipping {name}: {' '.join(str(exc).split())[:160]}")
    return subjects


def _contenders(runtimes: str) -> list:
    from ..export.bench import default_contenders
    from ..export.errors import ExportError
    available = default_contenders()
    if runtimes in ("", "all"):
        return available
    wanted = {r for r in runtimes.split(",") if r}
    known = {"torch", "torch.compile", "onnxruntime", "onnxruntime-cuda", "onnxruntime-tensorrt", "openvino"}
    unknown = sorted(wanted - known)
    if unknown:
        raise ExportError(f"--runtimes: unknown {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return [c for c in available if c.runtime == "torch" or c.runtime in wanted]


def run(args: argparse.Namespace) -> int:
    import torch
    from ..export.bench import environment, format_rows, run_bench
    batches = _int_list(args.batches, "--batches")
    subjects = _subjects(args)
    threads = args.threads or torch.get_num_threads()
    env = environment(threads)
    print(f"cpu: {env['cpu']}, {env['cores']} cores, AMX: {'yes' if env['amx'] else 'no'}, "
          f"AVX512-BF16: {'yes' if env['avx512_bf16'] else 'no'}, OpenVINO BF16: "
          f"{'yes' if env['openvino_bf16'] else 'no'}; threads per runtime: {threads}")
    for subject in subjects:
        print(f"model {subject.name}: {subject.note}")
    contenders = _contenders(getattr(args, "runtimes", "all"))
    rows = run_bench(subjects, batches, contenders=contenders, threads=threads, rounds=args.rounds)
    print(format_rows(rows))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": [r.to_dict() for r in rows], "environment": env}, indent=2) + "\n",
                        encoding="utf-8")
        print(f"wrote {path}")
    return 0
