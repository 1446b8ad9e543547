"""How far batch norm's fp32 results land from float64, per form, alone and in SE-ResNeXt.

Three forms: aten's kernel on an NCHW map, aten's kernel on a channels-last map, and
``batch_norm=two_pass`` (:mod:`hotloop.ops.batch_norm`) on a channels-last map. For each:

- one ``[64, 64, 28, 28]`` map (values ``3 * randn + 1``, an affine norm): the relative error of the
  batch mean and variance, the output and the three gradients against float64, and the forward +
  backward time of the prepared fp32 inputs (medians of interleaved rounds, after warm-up);
- ``se_resnext_small`` on one ``image_mnist`` batch of 64: the relative error of all parameter
  gradients together against the float64 model;
- 12 training steps (``run_steps``, Adam) from the same weights and batches: the worst relative loss
  difference from eager NCHW, beside eager from weights moved by one ulp (the tuner's chaos floor,
  one sign pattern).

Correctness first; the times are of one op and only say what the accuracy costs there.

    HOTLOOP_RAW_ROOT=DIR python benchmarks/batch_norm_accuracy.py [--rounds 15] [--json F]
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hotloop  # noqa: F401 - declares the registry names
from hotloop.compose.build import build_run
from hotloop.engine import Strategy
from hotloop.engine.norm_formulations import use_batch_norm
from hotloop.engine.parity import STREAM_SEEDS, ParityCase, run_steps
from hotloop.ops.batch_norm import batch_norm2d
from hotloop.tools.hardware import detect_hardware, machine_header
from hotloop.tools.trajectory import perturb_weights, worst_rel_diff

FORMS = {"aten nchw": (False, "aten"), "aten channels_last": (True, "aten"), "two_pass channels_last": (True, "two_pass")}
STEPS = 12


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def _op_rows(rounds: int) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(0)
    x64 = torch.randn(64, 64, 28, 28, generator=gen, dtype=torch.float64) * 3 + 1     # [N, C, H, W]
    gy64 = torch.randn(x64.shape, generator=gen, dtype=torch.float64)
    w64, b64 = torch.rand(64, generator=gen, dtype=torch.float64) + 0.5, torch.randn(64, generator=gen, dtype=torch.float64)

    def inputs(dtype: torch.dtype, channels_last: bool) -> tuple[torch.Tensor, ...]:
        """The map, its upstream gradient, weight and bias in ``dtype`` and the layout (leaves)."""
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        return (x64.to(dtype, copy=True).contiguous(memory_format=fmt).requires_grad_(),
                gy64.to(dtype, copy=True).contiguous(memory_format=fmt),
                w64.to(dtype, copy=True).requires_grad_(), b64.to(dtype, copy=True).requires_grad_())

    def run(x: torch.Tensor, gy: torch.Tensor, w: torch.Tensor, b: torch.Tensor, impl: str) -> tuple[torch.Tensor, ...]:
        """The batch mean and variance, the output and the three gradients (set to None first)."""
        x.grad = w.grad = b.grad = None
        mean, var = torch.zeros(64, dtype=x.dtype), torch.zeros(64, dtype=x.dtype)
        y = batch_norm2d(x, mean, var, w, b, True, 1.0, 1e-5, impl)      # momentum 1: the batch statistics
        y.backward(gy)
        return mean, var * (x.numel() // 64 - 1) / (x.numel() // 64), y.detach(), x.grad, w.grad, b.grad

    want = run(*inputs(torch.float64, False), "aten")
    prepared = {name: inputs(torch.float32, channels_last) for name, (channels_last, _) in FORMS.items()}
    rows = {}
    for name, (_, impl) in FORMS.items():
        got = run(*prepared[name], impl)
        rows[name] = dict(zip(("mean", "var", "output", "input_grad", "weight_grad", "bias_grad"),
                              (_rel(g, w) for g, w in zip(got, want))))
    times: dict[str, list[float]] = {name: [] for name in FORMS}
    for r in range(rounds + 2):                                     # two warm-up rounds
        for name, (_, impl) in FORMS.items():
            start = time.perf_counter()
            run(*prepared[name], impl)
            if r >= 2:
                times[name].append(time.perf_counter() - start)
    for name in FORMS:
        rows[name]["fwd_bwd_ms"] = 1e3 * statistics.median(times[name])
    return rows


def _model_rows() -> dict[str, dict[str, float]]:
    run = build_run("image_mnist", "se_resnext50", "se_resnext_small", None, device="cpu")
    batches = list(itertools.islice(iter(run.problem.reader("train", run.hp)), STEPS))

    def grads(dtype: torch.dtype, channels_last: bool, impl: str) -> list[torch.Tensor]:
        model = copy.deepcopy(run.model).train().to(dtype)
        use_batch_norm(model, impl)
        x = batches[0]["inputs"].to(dtype)
        if channels_last:
            model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        logits, _ = model({"inputs": x, "targets": batches[0]["targets"]})         # [B, 1, K]
        F.cross_entropy(logits.squeeze(1), batches[0]["targets"].view(-1)).backward()
        return [p.grad.double() for p in model.parameters()]

    def losses(strategy: Strategy, seed: int | None = None) -> list[float]:
        model = copy.deepcopy(run.model).train()
        torch.manual_seed(STREAM_SEEDS[0])
        if seed is not None:
            perturb_weights(model, "fp32", seed)
        return run_steps(ParityCase(model, run.hp, batches), strategy, STEPS)[0]

    want = grads(torch.float64, False, "aten")
    reference = losses(Strategy())
    rows = {"one-ulp move": {"trajectory": worst_rel_diff(losses(Strategy(), seed=0), reference)}}
    for name, (channels_last, impl) in FORMS.items():
        got = grads(torch.float32, channels_last, impl)
        error = sum(float((g - w).pow(2).sum()) for g, w in zip(got, want)) ** 0.5
        rows[name] = {"gradient": error / sum(float(w.pow(2).sum()) for w in want) ** 0.5}
        if name != "aten nchw":
            strategy = Strategy(channels_last=channels_last, batch_norm=impl)
            rows[name]["trajectory"] = worst_rel_diff(losses(strategy), reference)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(machine_header("benchmarks/batch_norm_accuracy.py"))
    ops, model = _op_rows(args.rounds), _model_rows()
    for name, row in ops.items():
        print(f"{name:24s} " + ", ".join(f"{k} {v:.1e}" if k != "fwd_bwd_ms" else f"{k} {v:.2f}" for k, v in row.items()))
    for name, row in model.items():
        print(f"se_resnext_small {name:24s} " + ", ".join(f"{k} {v:.1e}" for k, v in row.items()))
    out = {"machine": detect_hardware("cpu").describe(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "op_shape": [64, 64, 28, 28], "rounds": args.rounds, "op": ops, "model": "se_resnext_small",
           "trajectory_steps": STEPS, "se_resnext_small": model}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
