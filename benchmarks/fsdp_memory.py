"""``data_parallel.py --fsdp-memory``: per-rank bytes of BERT under FSDP vs DDP, and both loss curves.

Per rank, at the optimizer phase of every step (gradients present), the bytes this rank
holds as parameters, gradients and (after the update) optimizer state: the local shards
under FSDP (``DTensor.to_local()``), the whole tensors under DDP. Each run is one gloo job
(``torch.distributed.run``, 1 thread per rank) of ``--steps`` Adam(W) steps of the hparams set
(``bert_base`` by default) on fixed random batches (global batch ``--batch`` x ``--seq-len``
tokens, 5 predicted positions per example; the same batches in both modes). The ratio is
FSDP's largest rank over DDP's largest rank. Also recorded: ``gathered_params_peak``, the
most parameter bytes gathered at once under FSDP (counted inside each unit's forward: the
root's and that unit's unsharded parameters), with ``memory_ratio_with_gathered_params`` (FSDP's
held bytes plus that peak, over DDP's), and each rank's peak RSS (the whole process over all its
runs, including the unsharded model built before sharding). DDP holds the whole model on every rank at any
world size, so the 4-rank ratio divides by the 2-rank DDP run unless ``--ddp-at-4`` runs DDP
on 4 ranks too (4 full copies of the model and its Adam state in host memory).
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import tempfile
from pathlib import Path
from typing import Any, Iterator

__all__ = ["run_memory", "memory_worker"]

PREDICTIONS = 5


def _local_bytes(tensors: Any) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def _batches(rank: int, world: int, steps: int, batch: int, length: int, vocab: int) -> list[dict]:
    import torch
    g = torch.Generator().manual_seed(7)
    rows = batch // world
    out = []
    for _ in range(steps):
        full = {"inputs": torch.randint(1, vocab, (batch, length), generator=g),
                "segment_ids": torch.randint(0, 2, (batch, length), generator=g),
                "mlm_positions": torch.randint(0, length, (batch, PREDICTIONS), generator=g),
                "targets": torch.randint(1, vocab, (batch, PREDICTIONS), generator=g),
                "nsp_targets": torch.randint(0, 2, (batch,), generator=g)}
        out.append({k: v[rank * rows:(rank + 1) * rows] for k, v in full.items()})
    return out


def _run_mode(mode: str, args: Any, rank: int, world: int) -> dict[str, Any]:
    import torch

    from hotloop.engine.build import build_step
    from hotloop.engine.strategy import Strategy
    from hotloop.hparams import get_hparams
    from hotloop.models.bert import BERT
    from hotloop.parallel import ProcessGroupContext, optimizer_state_bytes
    from hotloop.problems.base import ProblemSpec
    hp = get_hparams(args.hparams).replace(dropout=0.0, attention_dropout=0.0, max_length=args.seq_len)
    spec = ProblemSpec(task="pretrain", input_vocab_size=args.vocab, target_vocab_size=args.vocab,
                       max_input_length=args.seq_len, max_target_length=PREDICTIONS, pad_id=0)
    torch.manual_seed(0)
    model = BERT(hp, spec)
    ctx = ProcessGroupContext(mode)
    built = build_step(model, hp, Strategy(data_parallel=mode), wrap=ctx.wrap)
    seen: dict[str, int] = {"params": 0, "grads": 0, "optimizer": 0}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        if name == "optimizer":
            seen["params"] = max(seen["params"], _local_bytes(model.parameters()))
            seen["grads"] = max(seen["grads"], _local_bytes(p.grad for p in model.parameters()))
        yield
        if name == "optimizer":
            seen["optimizer"] = max(seen["optimizer"], optimizer_state_bytes(built.optimizer))
    built.step.phase = phase
    gathered = [0]

    def record() -> None:   # inside a unit's forward: its and the root's parameters are gathered
        gathered[0] = max(gathered[0], sum(p.numel() * p.element_size() for p in model.parameters()
                                           if not hasattr(p, "to_local")))
    for unit in (ctx.routed.units if mode == "fsdp" else []):
        inner = unit.forward
        unit.forward = lambda *a, _inner=inner, **k: (record(), _inner(*a, **k))[1]
    losses = []
    for batch in _batches(rank, world, args.steps if world == 2 else args.memory_steps, args.batch,
                          args.seq_len, args.vocab):
        stats = ctx.all_reduce_stats(built.step([batch]).stats)
        losses.append(float(stats["nll_sum"] / stats["tokens"]))
    ctx.routed.unpatch()
    del built, model, ctx
    gc.collect()
    return {**seen, "total": sum(seen.values()), "gathered_params_peak": gathered[0], "mlm_losses": losses,
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def memory_worker(args: Any) -> None:
    """One rank of one world size: each mode in turn; rank 0 writes every rank's numbers."""
    import torch
    import torch.distributed as dist

    from hotloop.parallel.group import init_process_group
    from hotloop.parallel.launch import worker_entry

    @worker_entry
    def main() -> None:
        torch.set_num_threads(1)
        init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        modes = args.modes.split(",")
        report = {mode: _run_mode(mode, args, rank, world) for mode in modes}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, report)
        if rank == 0:
            Path(args.out).write_text(json.dumps({m: [g[m] for g in gathered] for m in modes}))
        dist.destroy_process_group()

    main()


def run_memory(args: Any, script: str, repo: Path, launch: Any) -> dict[str, Any]:
    """Launch the 2-rank (DDP and FSDP) and 4-rank (FSDP; DDP with ``--ddp-at-4``) jobs; the report."""
    per_world: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world, modes in ((2, "allreduce,fsdp"), (4, "allreduce,fsdp" if args.ddp_at_4 else "fsdp")):
            out = Path(tmp) / f"memory_{world}.json"
            argv = [script, "--fsdp-memory-worker", "--out", str(out), "--modes", modes,
                    "--hparams", args.hparams, "--steps", str(args.steps), "--memory-steps", str(args.memory_steps),
                    "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--vocab", str(args.vocab)]
            launch(world, argv, module=False, env={
                "HOTLOOP_DIST_TIMEOUT_S": "1800", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])})
            per_world[str(world)] = json.loads(out.read_text())
    ddp_ref = {w: max(r["total"] for r in per_world[w]["allreduce"]) for w in per_world if "allreduce" in per_world[w]}
    ratio = {w: max(r["total"] for r in per_world[w]["fsdp"]) / ddp_ref.get(w, ddp_ref["2"]) for w in per_world}
    with_gathered = {w: max(r["total"] + r["gathered_params_peak"] for r in per_world[w]["fsdp"])
                     / ddp_ref.get(w, ddp_ref["2"]) for w in per_world}
    ddp_curve, fsdp_curve = per_world["2"]["allreduce"][0]["mlm_losses"], per_world["2"]["fsdp"][0]["mlm_losses"]
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(fsdp_curve, ddp_curve))
    return {"memory_ratio": ratio, "memory_ratio_with_gathered_params": with_gathered, "ddp_reference_world": {w: (w if w in ddp_ref else "2") for w in per_world},
            "per_rank_bytes": {w: {m: [{k: r[k] for k in ("params", "grads", "optimizer", "total",
                                                          "gathered_params_peak", "max_rss_bytes")} for r in ranks]
                                   for m, ranks in per_world[w].items()} for w in per_world},
            "loss_curves_2_ranks": {"ddp": ddp_curve, "fsdp": fsdp_curve, "max_rel_diff": worst},
            "config": {"hparams": args.hparams, "global_batch": args.batch, "seq_len": args.seq_len,
                       "vocab": args.vocab, "predictions_per_example": PREDICTIONS, "steps_2_ranks": args.steps,
                       "steps_4_ranks": args.memory_steps, "dropout": 0.0, "threads_per_rank": 1}}
