"""The rungs of the LSTM speed ladder (``benchmarks/lstm_ladder.py``): what each loop configuration
changes, the expert loop's row, and which rungs this CPU can run.

A rung is one configuration of the training loop. Rungs are cumulative (each adds one change to
the one above); ``alt:`` rows are measured on top of the previous cumulative rung but not carried
forward; the ``expert`` row is the plain loop with the lines a competent PyTorch user adds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from hotloop.engine.strategy import Strategy
from hotloop.ops.cpu_isa import cpu_isa

from expert_loop import expert_precision

__all__ = ["Rung", "EXPERT_PREFIX", "LOSS_READ_EVERY", "expert_rung", "ladder_rungs", "runnable_rungs"]


@dataclass(frozen=True)
class Rung:
    """One configuration of the training loop (see :func:`ladder_rungs`)."""

    name: str
    threads: int = 0                  # 0 = torch's default intra-op threads
    sync_every_step: bool = True      # loss.item() after every step (False: every LOSS_READ_EVERY steps)
    grads_to_none: bool = False       # zero_grad(set_to_none=True) instead of zero-filling
    foreach: bool = False             # multi-tensor clip + SGD update
    prefetch: bool = False            # hotloop.data.prefetch producer thread
    fused_kernel_ce: bool = False     # time-major logits + F.cross_entropy (one kernel)
    precision: str = "fp32"           # autocast dtype for the whole forward
    model_loss: bool = False          # use model.loss (with ``formulation``) instead
    clip_via_lr: bool = False         # clip factor folded into the SGD step (hotloop.engine.clipping)
    formulation: dict[str, Any] = field(default_factory=dict)   # Strategy formulation fields
    needs_fast_bf16: bool = False     # skipped (with a line) on a CPU without fast bf16
    compile: bool = False             # torch.compile the model's loss (inductor)
    strategy: Strategy | None = None  # hotloop default: build_step with this strategy
    cumulative: bool = True


EXPERT_PREFIX = "expert "
#: a loop without the per-step sync reads its pending losses this often (hotloop's ``sync_every``);
#: holding a whole epoch's detached losses grew the expert loop's heap by about one logits
#: buffer per step under glibc's default malloc settings (24 GB, killed, in lstm_lm_example)
LOSS_READ_EVERY = 50


def expert_rung() -> Rung:
    """The plain loop with the expert's lines (bf16 autocast only where the CPU has fast bf16,
    foreach clip + SGD, grads set to None, no per-step ``loss.item()``), torch's default threads."""
    precision = expert_precision("cpu")
    return Rung(f"{EXPERT_PREFIX}({precision}, foreach clip+SGD, set_to_none, no step sync)",
                sync_every_step=False, grads_to_none=True, foreach=True, precision=precision, cumulative=False)


def ladder_rungs(threads: int, default_strategy: Strategy | None, with_compile: bool,
                 extra_strategy: Strategy | None = None) -> list[Rung]:
    r0 = Rung("0 baseline (plain PyTorch loop)")
    r1 = replace(r0, name=f"1 threads (intra-op {threads})", threads=threads)
    r2 = replace(r1, name=f"2 no per-step host sync (read every {LOSS_READ_EVERY} steps)", sync_every_step=False)
    r3 = replace(r2, name="3 memory reuse (grads set_to_none)", grads_to_none=True)
    r4 = replace(r3, name="4 fused optimizer (foreach clip+SGD)", foreach=True)
    r5 = replace(r4, name="5 async reader (prefetch)", prefetch=True)
    r6 = replace(r5, name="6 graph rewrites (time-major, fused CE kernel)", fused_kernel_ce=True)
    r7 = replace(r6, name="7 bf16 autocast (whole model)", precision="bf16", cumulative=False,
                 needs_fast_bf16=True)
    r8 = replace(r6, name="8 fused output+CE (chunked, fp32)", model_loss=True, formulation={"fused_ce": True})
    r8h = replace(r8, name="8h alt: hoisted LSTM + fused CE", cumulative=False,
                  formulation={"fused_ce": True, "lstm_impl": "hoisted"})
    r8u = replace(r8, name="8u alt: unrolled LSTM + fused CE", cumulative=False,
                  formulation={"fused_ce": True, "lstm_impl": "unrolled"})
    r9 = replace(r8, name="9 fused CE with bf16 GEMM operands", needs_fast_bf16=True,
                 formulation={"fused_ce": True, "ce_gemm_dtype": "bf16"})
    r10 = replace(r9, name="10 alt: 9 + bf16 autocast LSTM", precision="bf16", cumulative=False)
    r11 = replace(r9, name="11 alt: 9 + hand-written BPTT LSTM, bf16 GEMMs", cumulative=False,
                  formulation={"fused_ce": True, "ce_gemm_dtype": "bf16", "lstm_impl": "bptt",
                               "lstm_gemm_dtype": "bf16"})
    below_13 = r9 if cpu_isa().fast_bf16 else r8          # without fast bf16 the chain goes on from 8
    r13 = replace(below_13, name="13 dropout masks from 16-bit draws (bits16)", needs_fast_bf16=False,
                  formulation={**below_13.formulation, "dropout_masks": "bits16"})
    r14 = replace(r13, name="14 clip factor folded into the SGD step", clip_via_lr=True)
    rungs = [r0, expert_rung(), r1, r2, r3, r4, r5, r6, r7, r8, r8h, r8u, r9, r10, r11, r13, r14]
    if with_compile:
        rungs.append(replace(below_13, name="12 alt: torch.compile (inductor) of the loss", compile=True,
                             cumulative=False))
    if extra_strategy is not None:
        rungs.append(Rung("hotloop+ strategy override " + _strategy_diff(extra_strategy), model_loss=True,
                          strategy=extra_strategy, cumulative=False))
    rungs.append(Rung("hotloop default (build_step, the planned Strategy)", model_loss=True,
                      strategy=default_strategy or Strategy()))
    return rungs


def runnable_rungs(rungs: list[Rung], log: Callable[[str], None] = print) -> list[Rung]:
    """``rungs`` less those this CPU cannot run fast, each skip said in one line."""
    isa = cpu_isa()
    if isa.fast_bf16:
        return rungs
    for rung in rungs:
        if rung.needs_fast_bf16:
            log(f"skipped rung {rung.name!r}: no fast bf16 on this CPU (usable ISA {isa.describe()})")
    return [r for r in rungs if not r.needs_fast_bf16]


def _strategy_diff(strategy: Strategy) -> str:
    base = Strategy().to_dict()
    return ",".join(f"{k}={v}" for k, v in strategy.to_dict().items() if base.get(k) != v) or "(none)"
