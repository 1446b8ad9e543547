"""Decoding speed on Multi30k test2016 (de -> en): greedy and beam 4, incremental vs re-running the prefix.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/decode.py [--output-dir RUN | --checkpoint F] [--json FILE]
        [--limit N] [--batch-size 32] [--max-length 50] [--hparams transformer_multi30k --override ...]

(``DIR`` holds ``multi30k/``.) Without a run, an untrained model of ``--hparams``
is timed (it rarely emits EOS, so every sentence runs to its maximum length:
a worst case for the prefix re-run). For each search it reports sentences/s and
output tokens/s (EOS included) of the default path (:func:`hotloop.decode.translate_ids`:
length-sorted batches, per-layer key/value cache, device-side beam bookkeeping),
the same search re-running the decoder over the whole prefix each step
(``incremental_speedup = prefix seconds / default seconds``; goal >= 3 at beam 4),
and, for greedy, a plain eager loop as one would write it by hand (full
``model(batch)`` forward over source and prefix every step, one host check per
step): ``vs_plain_loop = plain seconds / default seconds``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hotloop.decode.translate import (DecodeOptions, fit_source, length_sorted, pad_batch,  # noqa: E402
                                      strip_ids, translate_ids)
from hotloop.hparams import get_hparams  # noqa: E402
from hotloop.problems.base import EOS_ID  # noqa: E402
from hotloop.problems.multi30k import Multi30kDeEn  # noqa: E402
from hotloop.registry import models  # noqa: E402
from hotloop.tools.hardware import detect_hardware  # noqa: E402
from hotloop.compose.build import build_model  # noqa: E402
from hotloop.compose.restore import find_checkpoint, load_trained  # noqa: E402


def _model_and_problem(args: argparse.Namespace) -> tuple[Any, Any, Any, str]:
    if args.output_dir or args.checkpoint:
        run = load_trained(find_checkpoint(args.output_dir, args.checkpoint), device=args.device,
                           data_dir=args.data_dir, raw_dir=args.raw_dir)
        return run.model, run.problem, run.spec, str(run.checkpoint)
    problem = Multi30kDeEn(data_dir=args.data_dir, raw_dir=args.raw_dir)
    problem.prepare()
    hp = get_hparams(args.hparams, args.override)
    spec = problem.spec(hp)
    return build_model(models.get(args.model), hp, spec, args.device).eval(), problem, spec, "untrained"


def plain_greedy_loop(model: Any, sources: list[list[int]], options: DecodeOptions, batch_size: int,
                      device: str) -> list[list[int]]:
    """The hand-written baseline: full forward over source and prefix each step, host check each step."""
    out: list[list[int]] = [[] for _ in sources]
    cap = model.max_decode_length or 10**9
    for batch in length_sorted(list(enumerate(sources)), batch_size):
        inputs = pad_batch([ids for _, ids in batch], device)
        limit = min(max(len(ids) for _, ids in batch) + options.max_extra, cap)
        prefix = inputs.new_zeros((len(batch), 0))
        with torch.no_grad():
            for _ in range(limit):
                targets = torch.cat([prefix, prefix.new_zeros((len(batch), 1))], dim=1)
                logits, _ = model({"inputs": inputs, "targets": targets})
                prefix = torch.cat([prefix, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
                if bool((prefix == EOS_ID).any(dim=1).all()):
                    break
        for (index, ids), row in zip(batch, prefix.tolist()):
            own_limit = min(len(ids) + options.max_extra, cap)   # the search's per-sentence limit
            out[index] = strip_ids(row[: own_limit - 1])
    return out


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def measure(model: Any, sources: list[list[int]], beam: int, args: argparse.Namespace) -> dict[str, Any]:
    options = DecodeOptions(beam_size=beam, alpha=args.alpha, max_extra=args.max_length)
    prefix_options = DecodeOptions(beam_size=beam, alpha=args.alpha, max_extra=args.max_length, cached=False)
    run = lambda opts: translate_ids(model, sources, opts, batch_size=args.batch_size, device=args.device)  # noqa: E731
    run(options) if args.warmup else None
    seconds, outputs = _timed(lambda: run(options))
    tokens = sum(len(o) + 1 for o in outputs)
    prefix_seconds, prefix_outputs = _timed(lambda: run(prefix_options))
    row: dict[str, Any] = {
        "beam_size": beam, "sentences": len(sources), "seconds": round(seconds, 3),
        "sentences_per_s": round(len(sources) / seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
        "prefix_rerun_seconds": round(prefix_seconds, 3),
        "incremental_speedup": round(prefix_seconds / seconds, 2),
        "same_tokens_as_prefix_rerun": sum(a == b for a, b in zip(outputs, prefix_outputs)) / len(sources)}
    if beam == 1:
        plain_seconds, plain = _timed(lambda: plain_greedy_loop(model, sources, options, args.batch_size,
                                                                args.device))
        row.update(plain_loop_seconds=round(plain_seconds, 3), vs_plain_loop=round(plain_seconds / seconds, 2),
                   same_tokens_as_plain_loop=sum(a == b for a, b in zip(outputs, plain)) / len(sources))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir")
    parser.add_argument("--checkpoint")
    parser.add_argument("--data-dir")
    parser.add_argument("--raw-dir", help="the Multi30k .gz files (default: $HOTLOOP_RAW_ROOT/multi30k)")
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--hparams", default="transformer_multi30k")
    parser.add_argument("--override", default="")
    parser.add_argument("--limit", type=int, default=0, help="first N test sentences (0 = all 1000)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=50, help="extra tokens over the source length")
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false")
    parser.add_argument("--json", nargs="?", const="-", default=None, help="write JSON to FILE (or stdout)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    hw = detect_hardware(args.device)
    print(f"# {hw.describe()}; AMX: {'amx_bf16' in hw.cpu_bf16}; torch threads {torch.get_num_threads()}",
          file=sys.stderr)
    model, problem, spec, source = _model_and_problem(args)
    text = problem.split_text("test")["inputs"]
    text = text[: args.limit] if args.limit else text
    sources = [fit_source(ids, spec.max_input_length)[0] for ids in problem.encoder.encode_many(text)]
    report = {"machine": {"cpu": hw.cpu_model, "amx": "amx_bf16" in hw.cpu_bf16, "cores": hw.cores,
                          "threads": torch.get_num_threads(), "device": args.device, "torch": torch.__version__},
              "model": source, "config": {k: getattr(args, k) for k in ("model", "hparams", "override", "limit",
                                                                      "batch_size", "max_length", "alpha")},
              "results": {}}
    for beam in (int(b) for b in args.beams.split(",") if b):
        name = "greedy" if beam == 1 else f"beam{beam}"
        report["results"][name] = row = measure(model, sources, beam, args)
        print(f"{name}: {row}", file=sys.stderr)
    if args.json:
        text_out = json.dumps(report, indent=2)
        if args.json == "-":
            print(text_out)
        else:
            Path(args.json).write_text(text_out + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
