"""``hotloop decode``: translate lines with a seq2seq run, or continue prompts with a language model.

Input is ``--decode-from-file`` (else stdin), one sentence or prompt per line;
output is ``--decode-to-file`` (else stdout), one line per input line in input
order, written as soon as every earlier line is done. Lines are decoded in
batches sorted by length.

Seq2seq runs: beam search (``--beam-size``, 1 = greedy) with the GNMT length
penalty ``--alpha``; a translation has at most ``--max-length`` tokens more than
its source (both counted in subwords with EOS), capped by the model's longest
target. Language-model runs: each prompt (the start of a sentence) is continued
by sampling (``--temperature``, ``--top-k``, ``--top-p``, ``--seed``) until the end
of the sentence or ``--max-length`` new tokens; the output line is the continuation.

Input handling: an empty (or blank) line gives an empty output line for a
seq2seq run and samples a sentence from scratch for a language model; a source
longer than the model's maximum input length is cut to it (a warning names the
line); a line that is not UTF-8 stops the run with an error naming it, after
every earlier line was written. Sampling flags on a seq2seq run, or beam flags
on a language-model run, are errors.

Multi-problem runs (``hotloop train --problem a,b``): ``--task PROBLEM`` names the
seq2seq task to decode (it may be left out when the run has exactly one); the
model's decoder for that task (its task token on the target side) translates
with that problem's vocabulary.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import IO, Any, Iterator

__all__ = ["NAME", "HELP", "RUN_FLAGS", "add_arguments", "run"]

NAME = "decode"
HELP = "translate lines with a seq2seq run, or sample continuations from a language model"
RUN_FLAGS = False
PROGRESS_MIN_LINES = 100
LM_FLAGS = ("temperature", "top_k", "top_p", "seed")
SEQ2SEQ_FLAGS = ("beam_size", "alpha")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default=None, help="run directory (its best, else latest checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint file")
    parser.add_argument("--which", choices=("best", "latest"), default="best")
    parser.add_argument("--decode-from-file", default=None, metavar="F", help="input lines (default: stdin)")
    parser.add_argument("--decode-to-file", default=None, metavar="F", help="output lines (default: stdout)")
    parser.add_argument("--beam-size", type=int, default=None, help="seq2seq: beams (1 = greedy; default 4)")
    parser.add_argument("--alpha", type=float, default=None, help="seq2seq: GNMT length penalty (default 0.6)")
    parser.add_argument("--max-length", type=int, default=50, metavar="EXTRA",
                        help="seq2seq: at most source length + EXTRA tokens; LM: EXTRA new tokens (default 50)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--temperature", type=float, default=None, help="LM sampling temperature (default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="LM: sample among the k best (0 = all)")
    parser.add_argument("--top-p", type=float, default=None, help="LM: nucleus mass (default 1 = off)")
    parser.add_argument("--seed", type=int, default=None, help="LM sampling seed (default 0)")
    parser.add_argument("--task", default=None, metavar="PROBLEM",
                        help="multi-problem runs: the seq2seq task to decode (default: the only one)")
    parser.add_argument("--data-dir", default=None, help="prepared data (vocabulary); default: the run's")
    parser.add_argument("--raw-dir", default=None)
    parser.add_argument("--raw-root", default=None, metavar="DIR", help="raw-data root (HOTLOOP_RAW_ROOT)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--runtime", choices=("torch", "onnxruntime", "openvino"), default="torch",
                        help="seq2seq: run the exported encoder/decoder_step graphs on this runtime")
    parser.add_argument("--export-dir", default=None,
                        help="the `hotloop export --format onnx|openvino` folder (default: <output-dir>/export/<format>)")


def _check_flags(args: argparse.Namespace, task: str, checkpoint: Any, problem: str) -> None:
    wrong = LM_FLAGS if task == "seq2seq" else SEQ2SEQ_FLAGS
    given = [f"--{name.replace('_', '-')}" for name in wrong if getattr(args, name) is not None]
    if given:
        kind = "a seq2seq (translation)" if task == "seq2seq" else "a language-model"
        use = "sampling flags are for language models" if task == "seq2seq" else "beam flags are for seq2seq runs"
        raise _error(f"{' '.join(given)}: checkpoint {checkpoint} is {kind} run of problem {problem}; {use}")
    if args.batch_size < 1 or args.max_length < 0:
        raise _error(f"--batch-size must be >= 1 and --max-length >= 0 "
                     f"(got {args.batch_size} and {args.max_length})")


def _error(message: str) -> Exception:
    from ..decode.text_io import DecodeInputError
    return DecodeInputError(message)


def _load(args: argparse.Namespace) -> Any:
    from ..data.errors import DataError
    from ..train.checkpoint import CheckpointError
    from ..compose.restore import find_checkpoint, load_trained
    try:
        path = find_checkpoint(args.output_dir, args.checkpoint, which=args.which)
        return load_trained(path, device=args.device, data_dir=args.data_dir, raw_dir=args.raw_dir, prepare=False,
                            raw_root=args.raw_root)
    except (CheckpointError, DataError) as exc:
        raise _error(str(exc)) from None


@contextlib.contextmanager
def _streams(args: argparse.Namespace) -> Iterator[tuple[IO[bytes], IO[str], str, int | None]]:
    with contextlib.ExitStack() as stack:
        if args.decode_from_file:
            try:
                handle = stack.enter_context(open(args.decode_from_file, "rb"))
            except OSError as exc:
                raise _error(f"--decode-from-file {args.decode_from_file}: {exc.strerror}") from None
            total: int | None = sum(1 for _ in handle)
            handle.seek(0)
            source = args.decode_from_file
        else:
            handle, source, total = sys.stdin.buffer, "stdin", None
        if args.decode_to_file:
            try:
                out = stack.enter_context(open(args.decode_to_file, "w", encoding="utf-8"))
            except OSError as exc:
                raise _error(f"--decode-to-file {args.decode_to_file}: {exc.strerror}") from None
        else:
            out = sys.stdout
        yield handle, out, source, total


def _progress(args: argparse.Namespace, total: int | None) -> Any:
    from tqdm import tqdm
    show = not args.no_progress and (total >= PROGRESS_MIN_LINES if total is not None else sys.stderr.isatty())
    return tqdm(total=total, unit="line", file=sys.stderr, disable=not show, dynamic_ncols=True)


def run(args: argparse.Namespace) -> int:
    from ..cli.common import apply_raw_root, resolve_device
    from ..data.errors import DataError
    from ..decode.text_io import OrderedWriter, read_lines, text_codec
    from ..decode.worker import LMWorker, Seq2SeqWorker, decode_stream
    apply_raw_root(args)
    args.device = resolve_device(args.device)
    trained = _load(args)
    model, problem, spec = _decoding_target(args, trained)
    task = spec.task
    if task not in ("seq2seq", "lm"):
        raise _error(f"checkpoint {trained.checkpoint}: problem {problem.name} is a {task!r} task; "
                     f"hotloop decode serves seq2seq and language-model runs")
    _check_flags(args, task, trained.checkpoint, problem.name)
    try:
        codec = text_codec(problem)
    except DataError as exc:
        raise _error(str(exc)) from None
    if args.runtime != "torch" and (task != "seq2seq" or model is not trained.model):
        raise _error(f"--runtime {args.runtime}: exported decoding serves single-problem seq2seq runs")
    if task == "seq2seq":
        if not hasattr(model, "start_decoding"):
            raise _error(f"model {trained.run_info.get('model')} has no incremental decoder")
        decoder = model if args.runtime == "torch" else _runtime_decoder(args)
        worker: Any = Seq2SeqWorker(decoder, codec, spec.max_input_length, device=args.device,
                                    beam_size=args.beam_size or 4,
                                    alpha=0.6 if args.alpha is None else args.alpha, max_extra=args.max_length)
    else:
        worker = LMWorker(model, codec, device=args.device, max_new_tokens=args.max_length,
                          temperature=1.0 if args.temperature is None else args.temperature,
                          top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
                          seed=args.seed or 0)
    with _streams(args) as (handle, out, source, total), _progress(args, total) as bar:
        writer = OrderedWriter(out)
        decode_stream(worker, read_lines(handle, source), writer, batch_size=args.batch_size,
                      source=source, on_done=bar.update)
    return 0


def _decoding_target(args: argparse.Namespace, trained: Any) -> tuple[Any, Any, Any]:
    """(model, problem, spec) to decode with: the run's own, or one task of a multi-problem run."""
    problem = trained.problem
    if not hasattr(problem, "subproblem"):
        if args.task is not None:
            raise _error(f"--task {args.task}: checkpoint {trained.checkpoint} is a single-problem run "
                         f"({problem.name})")
        return trained.model, problem, trained.spec
    specs = {task.name: task.spec for task in trained.spec.tasks}      # each problem's spec, as trained
    seq2seq = [n for n in problem.names if specs[n].task == "seq2seq"]
    name = args.task
    if name is None:
        if len(seq2seq) != 1:
            raise _error(f"checkpoint {trained.checkpoint} is a multi-problem run: name the task with --task "
                         f"(seq2seq tasks: {', '.join(seq2seq) or 'none'})")
        name = seq2seq[0]
    if name not in seq2seq:
        raise _error(f"--task {name}: not a seq2seq task of this run (seq2seq tasks: "
                     f"{', '.join(seq2seq) or 'none'}; all tasks: {', '.join(problem.names)})")
    return trained.model.decoder_for(name), problem.subproblem(name), specs[name]


def _runtime_decoder(args: argparse.Namespace) -> Any:
    """The exported encoder/decoder_step graphs of the run on ``args.runtime`` (same search interface)."""
    from pathlib import Path

    from ..export import load_decoder
    folder = "onnx" if args.runtime == "onnxruntime" else "openvino"
    export_dir = args.export_dir or (Path(args.output_dir) / "export" / folder if args.output_dir else None)
    if export_dir is None:
        raise _error(f"--runtime {args.runtime} needs --export-dir (a `hotloop export --format {folder}` folder)")
    return load_decoder(export_dir, args.runtime)
