"""Rules that turn model structure + hardware + reader speed into Strategy proposals.

Each :class:`Proposal` names the rule that produced it (shown in the tune
table). Compute proposals are *timed* by the trials; input-pipeline proposals
(prefetch, workers) cannot be timed on prepared batches and are applied by
rule when the reader is measurably slow relative to the step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.strategy import Strategy
from ..models.formulation import FormulationOption
from .hardware import HardwareInfo
from .model_facts import ModelFacts

__all__ = ["Proposal", "ReaderFacts", "propose", "formulation_proposals", "baseline_strategy", "combine",
           "reduced_precision", "SMALL_OP_FLOPS", "HEAVY_SHARE", "CONV_LAYOUT_SHARE", "DATA_BOUND_RATIO"]

SMALL_OP_FLOPS = 2e6      # mean FLOPs per aten op below which dispatch/threading overhead dominates
HEAVY_SHARE = 0.5         # a FLOP share at or above this makes a model "matmul-" or "conv-heavy"
CONV_LAYOUT_SHARE = 0.3   # a conv FLOP share from which channels_last is worth timing (mask_rcnn_shapes: 45%)
DATA_BOUND_RATIO = 0.05   # reader time per batch / step time above which feeding must be async
COMPILE_OPS = 300         # ops per step above which whole-step capture is worth trying


@dataclass(frozen=True)
class ReaderFacts:
    """Measured cost of producing one batch on the training thread."""

    seconds_per_batch: float
    step_seconds: float = 0.0   # eager step time, filled once measured

    @property
    def ratio(self) -> float:
        return self.seconds_per_batch / self.step_seconds if self.step_seconds > 0 else 0.0


@dataclass(frozen=True)
class Proposal:
    label: str
    changes: dict[str, Any]
    rule: str
    timed: bool = True          # False: input-pipeline setting, applied by rule
    expected_gain: float = 0.0  # rough prior used only to order the trials
    compile_cost: float = 0.0   # rough extra seconds of the first step (capture / compilation)
    tags: tuple[str, ...] = field(default_factory=tuple)

    def apply(self, strategy: Strategy) -> Strategy:
        return strategy.replace(**self.changes)


def baseline_strategy() -> Strategy:
    """Plain eager fp32 with a per-tensor optimizer loop: the reference every candidate must beat."""
    return Strategy(backend="eager", precision="fp32", fused_optimizer=False, inplace=False,
                    graph_passes=False, intra_op_threads=0, executor="serial")


def reduced_precision(strategy: Strategy) -> bool:
    """Whether ``strategy`` computes anything below fp32: bf16/fp16 autocast, TF32 matmuls, or a
    formulation with bf16 GEMM operands (``ce_gemm_dtype``, ``lstm_gemm_dtype``)."""
    return strategy.precision != "fp32" or strategy.tf32 or strategy.formulation.bf16_gemms


#: least first-step cost of each capture backend, seconds (a cold inductor compile of a small model
#: on 2 cores; ``tools/compile_prices.py`` prices inductor from the step's op count, or from what
#: this machine measured for the same model and shapes)
COMPILE_COSTS = {"graph": 2.0, "inductor": 40.0}
#: a compiling backend is proposed when the planned run is long enough for this share of it to pay
#: for the compile (or for any model of many small ops)
COMPILE_PAYBACK_SHARE = 0.05


def _compile_rules(facts: ModelFacts, available_backends: tuple[str, ...], small_ops: bool,
                   planned_seconds: float | None, compile_costs: dict[str, float]) -> list[Proposal]:
    out: list[Proposal] = []
    many_small = facts.ops_per_step >= COMPILE_OPS and small_ops
    # inductor first: stage two of the trials (tools/stages.py) puts it on the faster eager settings
    # first (its generated kernels beat the graph backend's replay)
    for backend, default in sorted(COMPILE_COSTS.items(), key=lambda item: item[0] != "inductor"):
        if backend not in available_backends:
            continue
        cost = compile_costs.get(backend, default)
        pays = planned_seconds is not None and planned_seconds * COMPILE_PAYBACK_SHARE >= cost
        if not (many_small or pays):
            continue
        why = (f"many small ops ({facts.ops_per_step}/step)" if many_small else
               f"the planned run (~{planned_seconds:.0f} s) repays a ~{cost:.1f} s compile")
        out.append(Proposal(f"backend={backend}", {"backend": backend},
                            f"{why} -> whole-step capture (backend={backend})", expected_gain=0.2,
                            compile_cost=cost))
    return out


def _compute_rules(facts: ModelFacts, hw: HardwareInfo, available_backends: tuple[str, ...],
                   load: float, allow_reduced_precision: bool = True, planned_seconds: float | None = None,
                   compile_costs: dict[str, float] | None = None) -> list[Proposal]:
    out: list[Proposal] = []
    share = facts.flop_share
    small_ops = facts.ops_per_step > 0 and facts.flops_per_op < SMALL_OP_FLOPS
    if facts.sparse_embeddings == 0:
        cpu = hw.device == "cpu"     # torch's one-kernel update where it has one (else foreach)
        out.append(Proposal("fused_optimizer", {"fused_optimizer": True, **({"fused_kernel": True} if cpu else {})},
                            "no sparse gradients -> " + ("one-kernel (fused=True) optimizer update where torch "
                                                        "has one on CPU, else multi-tensor (foreach)" if cpu else
                                                        "multi-tensor (fused/foreach) optimizer update"),
                            expected_gain=0.06 if cpu else 0.05))
    busy = max(0.0, load - 1.0)             # runnable work besides this process
    if hw.cores > 1 and (small_ops or busy >= hw.cores / 2):
        threads = 1 if small_ops else max(1, hw.cores - round(busy))
        why = (f"many small ops ({facts.ops_per_step} ops, {facts.flops_per_op / 1e6:.2f} MFLOP/op)"
               if small_ops else f"shared cores (load average {load:.1f} on {hw.cores} cores)")
        out.append(Proposal(f"threads={threads}", {"intra_op_threads": threads, "executor": "serial"},
                            f"{why} -> serial executor, fewer threads",
                            expected_gain=0.1 if small_ops else min(0.5, busy / hw.cores)))
    if share.get("conv", 0.0) >= CONV_LAYOUT_SHARE and facts.has_conv2d:
        out.append(Proposal("channels_last", {"channels_last": True},
                            f"{share['conv']:.0%} of FLOPs in 2-D convolutions -> channels_last",
                            expected_gain=0.15))
        fused = next((p for p in out if p.label == "fused_optimizer"), None)
        if fused is not None:     # the update's gain alone is within noise; beside the layout it is judged
            out.append(Proposal("fused_optimizer in channels_last", {**fused.changes, "channels_last": True},
                                "the one-kernel update timed in the layout it updates (storage order), "
                                "beside channels_last alone in the same rounds", expected_gain=0.14))
    if share.get("conv", 0.0) >= HEAVY_SHARE:
        if hw.device == "cuda":
            out.append(Proposal("cudnn_benchmark", {"cudnn_benchmark": True},
                                f"conv-heavy ({share['conv']:.0%} of FLOPs) -> cudnn.benchmark",
                                expected_gain=0.1))
    dense = share.get("matmul", 0.0) + share.get("conv", 0.0)
    if dense >= HEAVY_SHARE and hw.fast_bf16 and allow_reduced_precision:
        why = "tensor cores" if hw.device == "cuda" else "+".join(hw.cpu_bf16)
        kind = "matmul" if share.get("matmul", 0.0) >= share.get("conv", 0.0) else "conv"
        out.append(Proposal("bf16", {"precision": "bf16"},
                            f"{kind}-heavy ({dense:.0%} of FLOPs in matmul/conv) on fast-bf16 hardware "
                            f"({why}) -> precision=bf16", expected_gain=0.3, tags=("lossy",)))
    # Strategy.tf32 covers cuBLAS matmuls and cuDNN convolutions (engine/flags.py); with it off a
    # step convolves in strict fp32, where a plain PyTorch loop has cuDNN's TF32 on by default
    if hw.device == "cuda" and hw.cuda_capability >= (8, 0) and dense >= HEAVY_SHARE and allow_reduced_precision:
        kind = "matmuls" if share.get("matmul", 0.0) >= share.get("conv", 0.0) else "convolutions"
        out.append(Proposal("tf32", {"tf32": True}, f"fp32 {kind} on Ampere+ -> TF32 tensor cores",
                            expected_gain=0.2, tags=("lossy",)))
    return out + _compile_rules(facts, available_backends, small_ops, planned_seconds, compile_costs or {})


def formulation_proposals(options: list[FormulationOption], hw: HardwareInfo,
                          clip_foldable: bool = False, allow_reduced_precision: bool = True) -> list[Proposal]:
    """The model's formulation options that fit this hardware, and the clip folded into a
    plain-SGD learning rate when ``clip_foldable``.

    An option with bf16 GEMM operands is proposed only where bf16 matmuls run in hardware
    (``hw.fast_bf16``), a ``cpu_only`` one (oneDNN's linear GEMMs) only for a CPU step; an option whose changes another proposed option contains is left
    out (the larger one is timed instead); an option is timed with the settings it names in
    ``timed_with`` (the 1x1 GEMM in ``channels_last``, the layout it is faster in); an option that
    changes the random stream (bits16 dropout masks) is proposed with the tag ``random_stream``:
    the parity guard judges it by its random-stream rule (:mod:`hotloop.engine.parity`).
    ``allow_reduced_precision=False`` leaves out the bf16 options before that, so their fp32
    subsets stay proposed.
    """
    fitting = [o for o in options if (hw.fast_bf16 or not o.needs_fast_bf16)
               and (hw.device == "cpu" or not o.cpu_only)
               and (allow_reduced_precision or o.rounding != "bf16")]
    kept = [o for o in fitting if not any(
        other is not o and other.changes.items() > o.changes.items() for other in fitting)]
    tags = {"bf16": ("lossy",), "random_stream": ("random_stream",)}
    out = [Proposal(o.label, {**o.timed_with, **o.changes}, f"formulation: {o.why}",
                    expected_gain=o.expected_gain, tags=tags.get(o.rounding, ())) for o in kept]
    if clip_foldable:
        out.append(Proposal("clip_via_lr", {"clip_via_lr": True},
                            "plain SGD with clipping -> clip factor folded into the learning rate "
                            "(one pass less over every gradient)", expected_gain=0.03))
    return out


def _data_rules(reader: ReaderFacts | None, hw: HardwareInfo, base: Strategy) -> list[Proposal]:
    if reader is None or reader.step_seconds <= 0 or reader.ratio < DATA_BOUND_RATIO:
        return []
    ratio = reader.ratio
    why = (f"data-bound reader ({reader.seconds_per_batch * 1e3:.2f} ms/batch = {ratio:.0%} of the "
           f"{reader.step_seconds * 1e3:.2f} ms step)")
    changes: dict[str, Any] = {"prefetch": max(base.prefetch, 2)}
    if ratio >= 0.5 and hw.cores > 1:
        workers = min(hw.cores - 1, max(1, math.ceil(ratio)))
        changes["num_workers"] = max(base.num_workers, workers)
        changes["prefetch"] = max(changes["prefetch"], 2 * workers)
        return [Proposal("more workers", changes, why + f" -> {workers} worker(s) + async prefetch",
                         timed=False, expected_gain=min(ratio, 1.0))]
    return [Proposal("prefetch", changes, why + " -> async prefetch overlaps it with compute",
                     timed=False, expected_gain=min(ratio, 1.0))]


def propose(facts: ModelFacts, hw: HardwareInfo, reader: ReaderFacts | None = None, *,
            base: Strategy | None = None, available_backends: tuple[str, ...] = (),
            load: float = 0.0, formulations: list[FormulationOption] | None = None,
            clip_foldable: bool = False, allow_reduced_precision: bool = True,
            planned_seconds: float | None = None, compile_costs: dict[str, float] | None = None) -> list[Proposal]:
    """All proposals for this model/hardware/reader, best expected gain first (timed ones first).

    ``load``: the 1-minute load average (``os.getloadavg()[0]``, this process included);
    other work on the cores makes fewer intra-op threads worth timing. ``formulations``:
    the model's formulation options (:func:`formulation_proposals`).
    ``allow_reduced_precision=False``: nothing below fp32 (:func:`reduced_precision`) is proposed.
    ``planned_seconds``: the planned run's length (eager steps), against which a compile is priced;
    ``compile_costs``: backend -> expected first-step seconds here (default :data:`COMPILE_COSTS`).
    """
    base = base or baseline_strategy()
    proposals = (_compute_rules(facts, hw, available_backends, load, allow_reduced_precision, planned_seconds,
                                compile_costs)
                 + formulation_proposals(list(formulations or []), hw, clip_foldable, allow_reduced_precision)
                 + _data_rules(reader, hw, base))
    if not allow_reduced_precision:     # whatever a rule proposes, the constraint holds
        proposals = [p for p in proposals if not reduced_precision(p.apply(base))]
    return sorted(proposals, key=lambda p: (not p.timed, -p.expected_gain))


def combine(proposals: list[Proposal], label: str = "all proposals") -> Proposal | None:
    """One proposal applying every timed, non-conflicting change (first wins on conflicts)."""
    changes: dict[str, Any] = {}
    used: list[str] = []
    for p in proposals:
        if not p.timed or any(k in changes and changes[k] != v for k, v in p.changes.items()):
            continue
        changes.update(p.changes)
        used.append(p.label)
    if len(used) < 2:
        return None
    cost = sum(p.compile_cost for p in proposals if p.label in used)
    tags = tuple(sorted({t for p in proposals if p.label in used for t in p.tags}))
    return Proposal(label, changes, "combined: " + " + ".join(used), compile_cost=cost, tags=tags)
