"""How noisy one sample of the chaos floor is, against an inductor step, on CycleGAN.

For windows of 3 consecutive training batches of ``cyclegan_small`` (the zoo's data), from the
same weights and random stream: eager fp32 (the reference), eager from weights moved by one ulp
under several sign patterns (``hotloop.tools.trajectory.perturb_weights``), and ``backend=inductor`` with
the fused update (the candidate the tuner times). Prints and writes (``--json``) each pattern's
worst relative loss deviation, the median (the floor the tuner uses, over
``trajectory.FLOOR_SEEDS``) and the candidate's deviation. Correctness only: no timing.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/chaos_floor_spread.py [--windows 3] [--seeds 4] [--json F]
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
from pathlib import Path

import torch

import hotloop  # noqa: F401 - declares the registry names
from hotloop.compose.build import build_run
from hotloop.engine import Strategy
from hotloop.engine.parity import STREAM_SEEDS, ParityCase, run_steps
from hotloop.tools.hardware import detect_hardware, machine_header
from hotloop.tools.trajectory import FLOOR_SEEDS, perturb_weights, worst_rel_diff

STEPS = 3
CANDIDATE = Strategy(backend="inductor", fused_optimizer=True, fused_kernel=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(machine_header("benchmarks/chaos_floor_spread.py"))
    run = build_run("shapes_unpaired", "cyclegan", "cyclegan_small", None, device="cpu")
    batches = list(itertools.islice(iter(run.problem.reader("train", run.hp)), STEPS * args.windows))

    def losses(window: int, strategy: Strategy, seed: int | None = None) -> list[float]:
        model = copy.deepcopy(run.model).train()
        torch.manual_seed(STREAM_SEEDS[0])
        if seed is not None:
            perturb_weights(model, "fp32", seed)
        case = ParityCase(model, run.hp, batches[window * STEPS:(window + 1) * STEPS])
        return run_steps(case, strategy, STEPS)[0]

    rows = []
    for window in range(args.windows):
        ref = losses(window, Strategy())
        moved = [worst_rel_diff(losses(window, Strategy(), seed), ref) for seed in range(args.seeds)]
        candidate = worst_rel_diff(losses(window, CANDIDATE), ref)
        floor = statistics.median(moved[:len(FLOOR_SEEDS)])
        rows.append({"window": window, "one_ulp_deviations": moved, "floor_median": floor,
                     "candidate_deviation": candidate, "candidate_over_floor": candidate / floor})
        print(f"window {window}: one-ulp patterns {', '.join(f'{d:.1e}' for d in moved)}; median of "
              f"{len(FLOOR_SEEDS)} {floor:.1e}; inductor + fused {candidate:.1e} ({candidate / floor:.2f}x)")
    out = {"machine": detect_hardware("cpu").describe(), "torch": torch.__version__, "model": "cyclegan_small",
           "steps": STEPS, "candidate": "backend=inductor, fused_optimizer, fused_kernel", "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
