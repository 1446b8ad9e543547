"""Which faster candidate the tuner judges first: fastest ratio, a wider one within noise before it."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from hotloop.hparams import HParams
from hotloop.tools import autotune
from hotloop.tools.proposals import baseline_strategy
from hotloop.tools.ranking import adds_backend, holds, judging_order
from hotloop.tools.significance import Comparison, compare_paired, significantly_slower
from hotloop.tools.trajectory import ChaosFloors
from hotloop.tools.trials import Trial

BASE = baseline_strategy()


def _trial(label: str, times: list[float], rounds: list[int], compile_cost: float = 0.0, **changes) -> Trial:
    trial = Trial(label, BASE.replace(**changes), "test", compile_cost=compile_cost, status="ok")
    trial.step_times, trial.step_rounds = list(times), list(rounds)
    trial.losses = [1.0] * (len(times) + 2)
    return trial


def _steps(base: float, rounds: range, noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [base * (1 + rng.uniform(-noise, noise)) for _ in rounds]


def _drifting_stages() -> tuple[Trial, Trial, Trial]:
    """Eager, bf16 alone (stage one) and bf16 + channels_last + fused update (stage two), as
    measured on mask_rcnn_shapes: eager took ~680 ms beside stage one and ~540 ms beside stage two."""
    one, two = range(0, 8), range(10, 18)
    eager = _trial("eager", _steps(0.680, one, 0.08, 1) + _steps(0.540, two, 0.08, 2), list(one) + list(two))
    alone = _trial("bf16", _steps(0.472, one, 0.08, 3), list(one), precision="bf16")
    wide = _trial("all faster", _steps(0.396, two, 0.08, 4), list(two), precision="bf16",
                  channels_last=True, fused_optimizer=True, fused_kernel=True)
    return eager, alone, wide


def _compared(trial: Trial, eager: Trial) -> Comparison:
    return compare_paired(trial.step_times, trial.step_rounds, eager.step_times, eager.step_rounds)


def test_slower_needs_the_gap_to_exceed_both_noises():
    clear = significantly_slower(Comparison(0.90, 0.92, 8, 0.01), Comparison(0.70, 0.72, 8, 0.01))
    noisy = significantly_slower(Comparison(0.733, 0.796, 8, 0.058), Comparison(0.695, 0.745, 8, 0.050))
    assert clear and not noisy
    assert not significantly_slower(Comparison(0.70, 0.72, 8, 0.01), Comparison(0.90, 0.92, 8, 0.01))
    medians = Comparison(0.80, 0.80, 2), Comparison(0.79, 0.79, 2)         # no standard error
    assert significantly_slower(*medians) and not significantly_slower(*reversed(medians))


def test_wider_means_every_setting_kept_and_no_new_compile():
    _, alone, wide = _drifting_stages()
    assert alone.strategy.changes_from(BASE) == {"precision": "bf16"}
    assert holds(wide, alone, BASE) and not holds(alone, wide, BASE)
    other = _trial("fp16 + cl", [], [], precision="fp16", channels_last=True)
    assert not holds(other, alone, BASE)                               # a field set differently
    compiled = _trial("bf16 + inductor", [], [], compile_cost=40.0, precision="bf16", backend="inductor")
    assert not holds(compiled, alone, BASE)                            # compiles what bf16 does not


def test_the_combination_goes_first_when_drift_between_stages_hides_its_gain():
    eager, alone, wide = _drifting_stages()
    entries = [(_compared(t, eager), t) for t in (alone, wide)]
    assert entries[0][0].ratio < entries[1][0].ratio                  # the lower ratio is the narrower one
    assert wide.median < alone.median
    assert judging_order(entries, BASE) == [wide, alone]


def test_a_combination_measured_clearly_slower_stays_behind():
    eager, alone, wide = _drifting_stages()
    wide.step_times = [t * 1.3 for t in wide.step_times]               # ~0.95 of eager beside it
    entries = [(_compared(t, eager), t) for t in (wide, alone)]
    assert judging_order(entries, BASE) == [alone, wide]


def test_choose_takes_the_combination(monkeypatch):
    eager, alone, wide = _drifting_stages()
    judged: list[str] = []

    def parity(pristine, hp, batches, trial, device, floor):
        judged.append(trial.label)
        return True, "check_parity ok (test)"

    monkeypatch.setattr(autotune, "_engine_parity", parity)
    runner = SimpleNamespace(device=torch.device("cpu"), hp=HParams(optimizer="adam"), pristine=None,
                             batches=[], step_calls=0)
    chosen = autotune._choose([eager, alone, wide], eager, runner, 0.02, ChaosFloors(runner, eager))
    assert chosen is wide and judged == ["all faster"]


@pytest.mark.parametrize("ratios", [(0.7, 0.8, 0.9), (0.9, 0.8, 0.7)])
def test_unrelated_candidates_keep_the_ratio_order(ratios):
    trials = [_trial(f"t{i}", [], [], intra_op_threads=i + 1) for i in range(3)]
    entries = [(Comparison(r, r + 0.01, 8, 0.01), t) for r, t in zip(ratios, trials)]
    assert judging_order(entries, BASE) == [t for _, t in sorted(entries, key=lambda e: e[0].ratio)]


def _yolov3_stage_two() -> tuple[Trial, Trial]:
    """``all faster`` and ``all faster + backend=graph`` as the yolov3_shapes fp32 trial table gave
    them: x0.901 (90% bound x0.974) and x0.859 (x0.876), in rounds of their own."""
    fields = dict(channels_last=True, fused_optimizer=True, fused_kernel=True, pointwise_conv="gemm")
    eager_side = _trial("all faster", [], [], **fields)
    graph = _trial("all faster + backend=graph", [], [], compile_cost=2.0, backend="graph", **fields)
    return eager_side, graph


def test_a_backend_on_top_goes_first_only_when_significantly_faster():
    eager_side, graph = _yolov3_stage_two()
    assert adds_backend(graph, eager_side, BASE) and not adds_backend(eager_side, graph, BASE)
    measured = [(Comparison(0.901, 0.974, 8, 0.054), eager_side), (Comparison(0.859, 0.876, 8, 0.015), graph)]
    assert judging_order(measured, BASE) == [eager_side, graph]        # within noise: no backend
    clear = [(Comparison(0.901, 0.915, 8, 0.010), eager_side), (Comparison(0.700, 0.712, 8, 0.010), graph)]
    assert judging_order(clear, BASE) == [graph, eager_side]           # the backend earns its place


def test_a_cached_compile_does_not_make_the_backend_a_wider_choice():
    eager_side, graph = _yolov3_stage_two()
    graph.compile_cost = 0.0                                            # priced as cached
    entries = [(Comparison(0.859, 0.876, 8, 0.015), graph), (Comparison(0.901, 0.974, 8, 0.054), eager_side)]
    assert judging_order(entries, BASE) == [eager_side, graph]
    assert holds(graph, eager_side, BASE)
    entries = [(Comparison(0.850, 0.870, 8, 0.015), eager_side), (Comparison(0.859, 0.876, 8, 0.015), graph)]
    assert judging_order(entries, BASE) == [eager_side, graph]          # no climb onto the backend
