"""``hotloop explain``: what a strategy does to one model, without training it.

Builds the problem's model and optimizer, applies the device flags, compiles
the step and runs it once on one real batch, then prints the effective
strategy, the device flags set, every graph pass with its match counts,
captures, graph breaks and fallbacks with reasons, and memory estimates.
Errors print one line and return a non-zero exit code.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import torch

from .strategy import Strategy, StrategyError, parse_strategy

__all__ = ["main", "explain", "ExplainError"]


class ExplainError(RuntimeError):
    """A user error for ``hotloop explain`` (one line)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotloop explain", description=__doc__.splitlines()[0])
    p.add_argument("--problem", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--hparams", default=None, help="hparams set (default: the problem's default)")
    p.add_argument("--override", default="", help='hparams overrides "k=v,k=v"')
    p.add_argument("--strategy-override", default=None, help='Strategy overrides "k=v,k=v"')
    p.add_argument("--device", default="cpu")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--raw-dir", default=None)
    return p


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _build(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from ..hparams import get_hparams
    from ..registry import models, problems
    problem = problems.get(args.problem)(args.data_dir, args.raw_dir)
    hp_name = args.hparams or getattr(problem, "default_hparams", "") or ""
    if not hp_name:
        raise ExplainError(f"problem {args.problem!r} has no default hparams set; pass --hparams")
    hp = get_hparams(hp_name, args.override or None)
    spec = problem.spec(hp)
    torch.manual_seed(getattr(hp, "seed", 0))
    model = models.get(args.model)(hp, spec)
    batch = next(iter(problem.reader("train", hp)))
    return problem, hp, model, batch


def explain(args: argparse.Namespace, out: Any = None) -> None:
    """Print the explanation for parsed ``args`` to ``out`` (default: stdout)."""
    from ..optim import build_optimizer
    from .capture import CaptureError, capture_joint
    from .flags import apply_device_flags
    from .step import compile_step, default_loss_fn
    device = torch.device(args.device)
    strategy = parse_strategy(Strategy(), args.strategy_override)
    strategy.validate(device)
    _, hp, model, batch = _build(args)
    model.to(device)
    batch = {k: v.to(device) for k, v in batch.items()}

    def say(line: str = "") -> None:
        print(line, file=out or sys.stdout)

    say("== effective strategy ==")
    default = Strategy()
    for f in dataclasses.fields(strategy):
        value = getattr(strategy, f.name)
        mark = "" if value == getattr(default, f.name) else "   (override)"
        say(f"  {f.name} = {value!r}{mark}")
    say("== device flags ==")
    for line in apply_device_flags(strategy, device).lines():
        say(f"  {line}")
    optimizer = build_optimizer(model.parameters(), hp, fused=strategy.fused_optimizer)
    step = compile_step(model, None, optimizer, strategy, max_grad_norm=hp.max_grad_norm)
    state = model.initial_state(batch["inputs"].shape[0], device) if hasattr(model, "initial_state") else None
    step([batch], state)
    say("== step ==")
    say(f"  backend={strategy.backend} executor={strategy.executor} precision={strategy.precision}")
    for line in step.report:
        say(f"  {line}")
    say(f"  fallback: {step.fallback_reason or 'none'}")
    graphs = step.captured_graphs() if hasattr(step, "captured_graphs") else []
    say("== graph passes ==")
    if not graphs:
        say("  none (passes run only on backend=graph captures)")
    for i, g in enumerate(graphs):
        say(f"  graph #{i + 1}: {g.nodes_captured} nodes captured -> {len(g.gm.graph.nodes)} after passes")
        for r in g.passes:
            say(f"    {r.line()}")
    say("== memory estimates ==")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    slots = {"adam": 2, "adamw": 2, "momentum": 1}.get(hp.optimizer, 0)
    say(f"  parameters: {sum(p.numel() for p in model.parameters()):,} ({_mb(params)}); "
        f"gradients {_mb(params)}; optimizer state {_mb(params * slots)} ({hp.optimizer})")
    analysis = graphs[0] if graphs else None
    if analysis is None:
        try:
            analysis = capture_joint(model, default_loss_fn, batch, state, 1, strategy.precision, [])
        except CaptureError as exc:
            say(f"  activations: unknown ({exc.reason})")
    if analysis is not None:
        critical, width = analysis.parallelism()
        say(f"  activations (peak live intermediates of the joint graph): "
            f"{_mb(analysis.activation_peak_bytes())}")
        say(f"  graph shape: {critical} ops on the critical path, {width:.2f} ops per level on average")


def main(argv: list[str] | None = None) -> int:
    from ..registry import RegistryError
    from ..hparams import HParamsError
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        explain(args)
    except (ExplainError, StrategyError, RegistryError, HParamsError, FileNotFoundError, ValueError) as exc:
        print(f"hotloop explain: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
