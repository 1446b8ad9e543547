"""Two Strategies' steps on one zoo model, side by side: what does one setting give on its own?

Both steps are built by ``build_step`` from copies of the same model and trained on the same
batches (made once, kept on the device: no reader is timed). After a warm-up block from the same
random state (whose losses are kept: where the two compute the same numbers they are equal), blocks
of ``--block`` steps alternate in order, each ending with a host read of its last loss. Step times
are medians; ``b_vs_a`` is the paired per-round ratio (``zoo_stats.paired_speedup``: above 1, B is
faster). The process runs with the Trainer's process settings.

    python benchmarks/strategy_pair.py --model se_resnext50 --a fused_optimizer=True,channels_last=True \\
        --b fused_optimizer=True,channels_last=True,se_backward=fused --json F

``--model PROBLEM/MODEL/HPARAMS`` names a run outside the zoo (``ptb_lm/lstm_lm/lstm_lm_example``).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import hotloop  # noqa: E402,F401 - declares the registry names
from hotloop.compose.build import build_run  # noqa: E402
from hotloop.data import to_device  # noqa: E402
from hotloop.engine import Strategy, build_step  # noqa: E402
from hotloop.engine.process_settings import apply_process_settings  # noqa: E402
from hotloop.tools.hardware import machine_header  # noqa: E402
from hotloop.tools.isolation import applied_strategy  # noqa: E402
from zoo import MODEL_OF, SIZES  # noqa: E402
from zoo_stats import paired_speedup, ratio_text  # noqa: E402

__all__ = ["pair_row", "main"]


def pair_row(name: str, a: str, b: str, *, rounds: int = 8, block: int = 3, batches: int = 4,
             size: str = "small", device: torch.device = torch.device("cpu")) -> dict[str, Any]:
    """The two steps on ``name``'s zoo configuration, or on ``PROBLEM/MODEL/HPARAMS`` (module doc);
    medians and the paired ratio."""
    if name.count("/") == 2:
        problem, model, hparams = name.split("/")
        overrides = None
    else:
        problem, hparams, overrides = SIZES[size][name]
        model = MODEL_OF.get(name, name)
    run = build_run(problem, model, hparams, overrides or None, device=device)
    reader = iter(run.problem.reader("train", run.hp))
    made = [to_device(next(reader), device) for _ in range(batches)]
    strategies = {key: Strategy(**Strategy.parse_overrides(text)).validate(device)
                  for key, text in (("a", a), ("b", b))}
    steps = {}
    for key, strategy in strategies.items():
        with applied_strategy(strategy, device):
            steps[key] = build_step(copy.deepcopy(run.model).train(), run.hp, strategy)
    times: dict[str, list[float]] = {"a": [], "b": []}
    first: dict[str, list[float]] = {"a": [], "b": []}
    for r in range(rounds + 1):
        for key in (("a", "b") if r % 2 else ("b", "a")):
            with applied_strategy(strategies[key], device):
                if r == 0:
                    torch.manual_seed(0)                 # the same random draws in both warm-up blocks
                start = time.perf_counter()
                losses = [steps[key].step([made[(r * block + i) % batches]]).loss for i in range(block)]
                values = [float(x) for x in torch.stack(losses).tolist()]    # the block's host read
                seconds = (time.perf_counter() - start) / block
            if r == 0:
                first[key] = values
            else:
                times[key].append(seconds)
    return {"model": name, "size": size, "problem": problem, "hparams": hparams,
            "a": strategies["a"].changes_from(Strategy()), "b": strategies["b"].changes_from(Strategy()),
            "step_ms": {key: 1e3 * statistics.median(ts) for key, ts in times.items()},
            "b_vs_a": paired_speedup(times["a"], times["b"]), "first_losses": first,
            "first_losses_equal": first["a"] == first["b"], "rounds": rounds, "block": block}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a zoo model (benchmarks/zoo.py), or PROBLEM/MODEL/HPARAMS")
    parser.add_argument("--a", required=True, metavar="K=V,...", help="the first Strategy's fields")
    parser.add_argument("--b", required=True, metavar="K=V,...", help="the second Strategy's fields")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    apply_process_settings()
    device = torch.device("cpu")
    header = machine_header("benchmarks/strategy_pair.py")
    print(header)
    row = pair_row(args.model, args.a, args.b, rounds=args.rounds, block=args.block, size=args.size, device=device)
    ms = row["step_ms"]
    print(f"[{args.model}] A {row['a']}: {ms['a']:.2f} ms; B {row['b']}: {ms['b']:.2f} ms; "
          f"A time / B's {ratio_text(row['b_vs_a'])}; "
          f"warm-up losses equal: {row['first_losses_equal']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "threads": torch.get_num_threads(),
                                               "rows": [row]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
