"""One full PTB epoch of the plain PyTorch loop, one of the expert loop, then one of ``hotloop train``.

The plain loop is the PyTorch example's ``word_language_model`` loop (the ladder's rung 0): eager
fp32, ``zero_grad``, ``clip_grad_norm_``, SGD, ``loss.item()`` every step, batches read
synchronously. The expert loop is the ladder's ``expert`` row (:func:`lstm_rungs.expert_rung`):
the plain loop plus bf16 autocast where the CPU has fast bf16, foreach clip + SGD,
``zero_grad(set_to_none=True)`` and no per-step ``loss.item()``.
``hotloop train`` runs as a user runs it, in a child process:

    hotloop train --problem ptb_lm --model lstm_lm --hparams lstm_lm_example --max-epochs 1 --eval-every 0

Both start from the same seed. Printed and written (``--json``):

- ``plain_tokens_per_s`` / ``expert_tokens_per_s`` / ``hotloop_tokens_per_s``: epoch train tokens /
  wall seconds. hotloop's wall time is the whole command: start-up, auto's tuning, the epoch and
  its one evaluation; the two loops' is their epoch alone, so the ratios do not favour hotloop;
- ``hotloop_steady_tokens_per_s``: the median of hotloop's logged train rows (tuning excluded);
- ``token_rate_ratio`` = hotloop_tokens_per_s / plain_tokens_per_s, ``token_rate_vs_expert`` =
  hotloop_tokens_per_s / expert_tokens_per_s (``steady_vs_expert`` from the logged rows);
- ``plain_valid_ppl`` / ``expert_valid_ppl`` / ``hotloop_valid_ppl`` after the epoch, all computed
  the same way (fp32, full logits, the whole valid split in the training batch shape; hotloop's
  from its last checkpoint), with ``ppl_rel_diff`` (hotloop against plain) and
  ``ppl_rel_diff_vs_expert``; ``hotloop_logged_valid_ppl`` is the run's own evaluation (at the
  run's precision); ``expert_settings`` names the expert row.

The three runs are sequential (an epoch cannot be interleaved), in one invocation on a quiet
machine; the CPU model, AMX and the thread count are printed.

    HOTLOOP_RAW_ROOT=DIR PYTHONPATH=. python benchmarks/lstm_epoch.py [--config example] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lstm_ladder import CONFIGS, RungRunner, eval_ppl, machine_facts, machine_line  # noqa: E402
from lstm_rungs import Rung, expert_rung, ladder_rungs  # noqa: E402
from hotloop.builtin import declare_builtins  # noqa: E402
from hotloop.hparams import get_hparams  # noqa: E402
from hotloop.registry import problems  # noqa: E402
from hotloop.compose.restore import find_checkpoint, load_trained  # noqa: E402

#: the fields of auto's choice the JSON keeps (its execution settings and the LSTM's formulation)
STRATEGY_KEYS = ("precision", "fused_optimizer", "fused_kernel", "backend", "intra_op_threads", "prefetch",
                 "num_workers", "fused_ce", "ce_gemm_dtype", "lstm_impl", "lstm_gemm_dtype", "dropout_masks",
                 "clip_via_lr", "linear_gemm")

__all__ = ["plain_epoch", "expert_epoch", "loop_epoch", "hotloop_epoch", "main"]


def plain_epoch(config: str) -> dict[str, Any]:
    """Train one epoch with the plain loop; valid ppl over the whole valid split."""
    return loop_epoch(config, ladder_rungs(torch.get_num_threads(), None, False)[0])


def expert_epoch(config: str) -> dict[str, Any]:
    """Train one epoch with the expert loop; valid ppl over the whole valid split."""
    return loop_epoch(config, expert_rung())


def loop_epoch(config: str, rung: Rung) -> dict[str, Any]:
    """Train one epoch with one of the ladder's hand-written loops (``rung``), from the config's seed."""
    declare_builtins()
    hp = get_hparams(CONFIGS[config])
    problem = problems.get("ptb_lm")()
    problem.prepare()
    runner = RungRunner(rung, hp, problem, torch.get_num_threads())
    steps = len(problem.reader("train", hp))
    seconds = runner.run(steps)
    valid = list(problem.reader("valid", hp))
    return {"name": rung.name, "steps": steps, "tokens": runner.tokens, "seconds": seconds,
            "tokens_per_s": runner.tokens / seconds, "valid_ppl": eval_ppl(runner.model, valid)}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hotloop_epoch(config: str, tokens: int) -> dict[str, Any]:
    """Run ``hotloop train`` for one epoch in a child process; its wall time and metrics."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "hotloop", "train", "--problem", "ptb_lm", "--model", "lstm_lm",
                   "--hparams", CONFIGS[config],
                   "--max-epochs", "1", "--eval-every", "0", "--output-dir", out]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        start = time.perf_counter()
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        rows = _rows(Path(out) / "metrics.jsonl")
        strategy = json.loads((Path(out) / "run.json").read_text())["strategy"]   # auto's choice
        trained = load_trained(find_checkpoint(out, which="latest"))
        valid_batches = list(trained.problem.reader("valid", trained.hp))
        fp32_ppl = eval_ppl(trained.model, valid_batches)          # as the plain loop's: fp32, full logits
    train = [r for r in rows if r.get("split") == "train" and "tokens_per_s" in r]
    valid = [r for r in rows if r.get("split") == "valid"]
    return {"command": " ".join(["hotloop"] + command[3:-2]), "seconds": seconds, "tokens_per_s": tokens / seconds,
            "steady_tokens_per_s": statistics.median(r["tokens_per_s"] for r in train) if train else None,
            "valid_ppl": fp32_ppl, "logged_valid_ppl": valid[-1]["ppl"] if valid else None,
            "strategy": {k: v for k, v in strategy.items() if k in STRATEGY_KEYS}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="example")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    facts = machine_facts()
    print(f"{machine_line('lstm_epoch.py')}; config {args.config}", flush=True)
    plain = plain_epoch(args.config)
    print(f"plain loop: {plain['steps']} steps in {plain['seconds']:.1f} s, {plain['tokens_per_s']:.0f} tok/s, "
          f"valid ppl {plain['valid_ppl']:.2f}", flush=True)
    expert = expert_epoch(args.config)
    print(f"expert loop: {expert['steps']} steps in {expert['seconds']:.1f} s, {expert['tokens_per_s']:.0f} tok/s, "
          f"valid ppl {expert['valid_ppl']:.2f} ({expert['name']})", flush=True)
    fast = hotloop_epoch(args.config, plain["tokens"])
    steady = fast["steady_tokens_per_s"]
    print(f"hotloop train: {fast['seconds']:.1f} s for the whole command, {fast['tokens_per_s']:.0f} tok/s "
          f"({steady:.0f} tok/s in its logged rows), valid ppl {fast['valid_ppl']:.2f}; auto chose {fast['strategy']}")
    result = {"config": args.config, **facts, "threads": torch.get_num_threads(),
              "plain_tokens_per_s": plain["tokens_per_s"], "plain_seconds": plain["seconds"],
              "plain_valid_ppl": plain["valid_ppl"], "expert_settings": expert["name"],
              "expert_tokens_per_s": expert["tokens_per_s"], "expert_seconds": expert["seconds"],
              "expert_valid_ppl": expert["valid_ppl"], "hotloop_command": fast["command"],
              "hotloop_seconds": fast["seconds"], "hotloop_tokens_per_s": fast["tokens_per_s"],
              "hotloop_steady_tokens_per_s": steady, "hotloop_valid_ppl": fast["valid_ppl"],
              "hotloop_logged_valid_ppl": fast["logged_valid_ppl"], "hotloop_strategy": fast["strategy"],
              "token_rate_ratio": fast["tokens_per_s"] / plain["tokens_per_s"],
              "token_rate_vs_expert": fast["tokens_per_s"] / expert["tokens_per_s"],
              "steady_vs_expert": steady / expert["tokens_per_s"],
              "ppl_rel_diff": abs(fast["valid_ppl"] - plain["valid_ppl"]) / plain["valid_ppl"],
              "ppl_rel_diff_vs_expert": abs(fast["valid_ppl"] - expert["valid_ppl"]) / expert["valid_ppl"]}
    print(f"token-rate ratio {result['token_rate_ratio']:.2f}x (whole command) / "
          f"{steady / plain['tokens_per_s']:.2f}x (logged rows); valid ppl {plain['valid_ppl']:.2f} vs "
          f"{fast['valid_ppl']:.2f} ({result['ppl_rel_diff']:.2%})")
    print(f"against the expert loop: {result['token_rate_vs_expert']:.2f}x (whole command) / "
          f"{result['steady_vs_expert']:.2f}x (logged rows); valid ppl {expert['valid_ppl']:.2f} vs "
          f"{fast['valid_ppl']:.2f} ({result['ppl_rel_diff_vs_expert']:.2%})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
