"""Recommendations of the speed doctor: which Strategy field / reader / hparams setting to change.

Each rule reads the measured report and estimates the gain as the share of
step time the change can remove at most (an upper bound, stated as such).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .hardware import GemmPeak, HardwareInfo
from .proposals import HEAVY_SHARE, SMALL_OP_FLOPS
from .profile_report import Recommendation

if TYPE_CHECKING:
    from .profile_report import ProfileReport

__all__ = ["recommend"]

DATA_SHARE = 0.05       # data wait above this share of the step is worth fixing
HOST_SHARE = 0.30       # host overhead above this share: the step is dispatch-bound
OPTIMIZER_SHARE = 0.15
SYNC_SHARE = 0.05


def _capture_backends() -> list[str]:
    return ["graph", "inductor"]


def recommend(report: "ProfileReport", hw: HardwareInfo, peak: GemmPeak) -> list[Recommendation]:
    """All rules that fire, largest expected gain first."""
    s, split, total = report.strategy, report.split, report.step_seconds or 1e-12
    share = {k: v / total for k, v in split.items()}
    facts = report.facts
    out: list[Recommendation] = []
    if share["data_wait"] > DATA_SHARE:
        if s.prefetch == 0:
            out.append(Recommendation("Strategy.prefetch", "2", f"the step waits for data {share['data_wait']:.0%} "
                                      "of the time and feeding is synchronous", share["data_wait"]))
        else:
            workers = s.num_workers + 1 if hw.cores > s.num_workers + 1 else s.num_workers
            out.append(Recommendation("Strategy.num_workers", str(workers),
                                      f"the prefetch queue runs dry (data wait {share['data_wait']:.0%} of the "
                                      f"step, mean depth {report.queue.mean_depth}): the reader is slower than "
                                      "the step; more workers (or a cheaper reader) help", share["data_wait"]))
    in_model = report.syncs_per_step.get("forward", 0.0) + report.syncs_per_step.get("backward", 0.0)
    if in_model >= 0.5:
        out.append(Recommendation("model code", "no .item()/.cpu()/bool(tensor) in forward/loss",
                                  f"the model reads {in_model:.1f} values back to the host per step (each one "
                                  "stalls the device pipeline): keep statistics as tensors", 0.05))
    if report.syncs_per_step.get("optimizer", 0.0) >= 1 and not s.fused_optimizer and report.device != "cpu":
        out.append(Recommendation("Strategy.fused_optimizer", "True",
                                  f"the per-tensor optimizer syncs {report.syncs_per_step['optimizer']:.0f} "
                                  "times per step", share["optimizer"] * 0.5))
    if share["sync"] > SYNC_SHARE:
        out.append(Recommendation("Strategy.sync_every", str(s.sync_every * 4),
                                  f"metric read-back costs {share['sync']:.0%} of the step", share["sync"] * 0.75))
    if share["host_overhead"] > HOST_SHARE:
        backends = [b for b in _capture_backends() if b != s.backend]
        if backends:
            out.append(Recommendation("Strategy.backend", backends[0],
                                      f"{share['host_overhead']:.0%} of the step is host overhead (Python + "
                                      "dispatch between ops): capture the whole step", share["host_overhead"] * 0.5))
        out.append(Recommendation("hparams.batch_size", "2x",
                                  f"host overhead is {share['host_overhead']:.0%}: bigger ops amortise it",
                                  share["host_overhead"] * 0.5))
    if share["optimizer"] > OPTIMIZER_SHARE and not s.fused_optimizer and not (facts and facts.sparse_embeddings):
        out.append(Recommendation("Strategy.fused_optimizer", "True",
                                  f"the per-tensor optimizer loop takes {share['optimizer']:.0%} of the step",
                                  share["optimizer"] * 0.5))
    if facts is not None:
        small = facts.ops_per_step > 0 and facts.flops_per_op < SMALL_OP_FLOPS
        if small and hw.cores > 1 and s.intra_op_threads != 1 and share["host_overhead"] > 0.1:
            out.append(Recommendation("Strategy.intra_op_threads", "1",
                                      f"ops are small ({facts.flops_per_op / 1e6:.2f} MFLOP each): thread "
                                      "hand-off costs more than it saves", 0.1))
        compute = share["forward"] + share["backward"]
        dense = facts.flop_share.get("matmul", 0) + facts.flop_share.get("conv", 0)
        if s.precision == "fp32" and dense >= HEAVY_SHARE and hw.fast_bf16 and peak.bf16_flops > peak.fp32_flops:
            gain = compute * dense * (1 - peak.fp32_flops / peak.bf16_flops)
            out.append(Recommendation("Strategy.precision", "bf16",
                                      f"{dense:.0%} of FLOPs are matmuls and convolutions and this machine's "
                                      f"bf16 GEMM peak is {peak.bf16_flops / peak.fp32_flops:.1f}x fp32 "
                                      "(check parity: tolerance 3e-2)", gain))
        if facts.flop_share.get("conv", 0) >= HEAVY_SHARE and facts.has_conv2d and not s.channels_last:
            out.append(Recommendation("Strategy.channels_last", "True",
                                      f"{facts.flop_share['conv']:.0%} of FLOPs are convolutions", compute * 0.2))
    return sorted(out, key=lambda r: -r.expected_gain)
