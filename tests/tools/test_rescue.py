"""tools/rescue.py: a combination that failed parity is timed again without the parts that failed
parity alone, or with the winner's settings on top, and replaces the narrower winner unless it
measured slower."""
from __future__ import annotations

import random

from hotloop.tools.proposals import baseline_strategy
from hotloop.tools.ranking import NOT_REACHED
from hotloop.tools.rescue import PartJudge, keeps_rescue, with_winner, without_failed_parts
from hotloop.tools.trials import Trial

BASE = baseline_strategy()
FUSED = {"fused_optimizer": True, "fused_kernel": True}


def _trial(label: str, parity: str = "", seconds: float = 1.0, **changes: object) -> Trial:
    rng = random.Random(label)
    trial = Trial(label, BASE.replace(**changes), "test", parity=parity)
    trial.step_times = [seconds * (1 + 0.01 * rng.random()) for _ in range(8)]
    trial.step_rounds = list(range(8))
    return trial


def _deeplab_like() -> tuple[Trial, list[Trial]]:
    """DeepLabV3+'s fp32 tune: the 1x1 GEMM fails parity alone and in the combination."""
    baseline = _trial("eager", "reference", 1.0)
    layout = _trial("channels_last", "ok", 0.89, channels_last=True)
    fused = _trial("fused_optimizer", "REJECTED (loss rel diff 1.1e-03 > tol 1e-04)", 1.0, **FUSED)   # not faster
    taps = _trial("dilated_conv_wgrad=taps", "not judged", 0.98, dilated_conv_wgrad="taps")
    gemm = _trial("pointwise_conv=gemm", "ok (..); REJECTED by check_parity (..)", 0.90,
                  channels_last=True, pointwise_conv="gemm")
    combined = _trial("all faster", "ok (..); REJECTED by check_parity (..)", 0.82, channels_last=True,
                      dilated_conv_wgrad="taps", pointwise_conv="gemm", **FUSED)
    return baseline, [layout, fused, taps, gemm, combined]


def test_the_failed_combination_is_proposed_without_its_failing_part() -> None:
    baseline, trials = _deeplab_like()
    rescue = without_failed_parts(trials, trials[0], baseline, 0.02)
    assert rescue is not None and rescue.label == "all faster - pointwise_conv=gemm"
    assert rescue.strategy.changes_from(BASE) == {"channels_last": True, "dilated_conv_wgrad": "taps", **FUSED}


def test_nothing_is_proposed_without_a_part_rejected_alone_or_when_it_was_timed() -> None:
    baseline, trials = _deeplab_like()
    trials[3].parity = "not judged"                       # nothing says which part fails
    assert without_failed_parts(trials, trials[0], baseline, 0.02) is None
    baseline, trials = _deeplab_like()
    timed = _trial("timed", "ok", 0.85, channels_last=True, dilated_conv_wgrad="taps", **FUSED)
    assert without_failed_parts(trials + [timed], trials[0], baseline, 0.02) is None
    trials[-1].parity = "check_parity ok"                 # the combination passed: nothing to rescue
    assert without_failed_parts(trials, trials[-1], baseline, 0.02) is None


def _mask_rcnn_like() -> tuple[Trial, list[Trial]]:
    """Mask R-CNN's fp32 tune: the 1x1 GEMM (in channels_last) ties with eager alone, its trajectory fails
    the plain tolerance, and the combination with it fails check_parity; RoIAlign as GEMMs won alone."""
    baseline = _trial("eager", "reference", 1.0)
    roi = _trial("roi_align separable", "ok", 0.53, roi_align_impl="separable")
    fused = _trial("fused_optimizer", "ok (rel 1.2e-07 <= 1e-04, 12 steps)", 0.97, **FUSED)
    gemm = _trial("pointwise_conv=gemm", "REJECTED (loss rel diff 8.68e-02 > tol 1e-05 over 12 steps)", 0.99,
                  channels_last=True, pointwise_conv="gemm")
    combined = _trial("all faster", "ok (..); REJECTED by check_parity (..)", 0.54, channels_last=True,
                      roi_align_impl="separable", pointwise_conv="gemm", **FUSED)
    return baseline, [roi, fused, gemm, combined]


def test_a_part_that_tied_fails_only_when_judging_it_in_full_rejects_it() -> None:
    baseline, trials = _mask_rcnn_like()
    winner = trials[0]
    assert without_failed_parts(trials, winner, baseline, 0.02) is None     # judged by the plain tolerance only
    judged: list[str] = []

    def passes(trial: Trial) -> bool:
        judged.append(trial.label)
        return trial.label != "pointwise_conv=gemm"
    rescue = without_failed_parts(trials, winner, baseline, 0.02, PartJudge(passes, affordable=lambda trial: True))
    assert rescue is not None and rescue.label == "all faster - pointwise_conv=gemm"
    assert rescue.strategy.changes_from(BASE) == {"roi_align_impl": "separable", **FUSED}
    assert judged == ["pointwise_conv=gemm"]                # only a part judging left open is judged again
    baseline, trials = _deeplab_like()                      # a rejected tie that passes in full stays in
    rescue = without_failed_parts(trials, trials[0], baseline, 0.02,
                                  PartJudge(lambda trial: trial.label != "pointwise_conv=gemm", lambda trial: True))
    assert rescue is not None and rescue.strategy.changes_from(BASE)["fused_kernel"] is True


def test_each_part_is_judged_once_whatever_the_combinations_it_is_in() -> None:
    baseline, trials = _mask_rcnn_like()
    ties = _trial("all not slower", trials[-1].parity, 0.55, **trials[-1].strategy.changes_from(BASE))
    judged: list[str] = []

    def passes(trial: Trial) -> bool:
        judged.append(trial.label)
        return True
    assert without_failed_parts(trials + [ties], trials[0], baseline, 0.02, PartJudge(passes, lambda t: True)) is None
    assert judged == ["pointwise_conv=gemm"]


def test_a_faster_part_judging_did_not_reach_is_judged_when_the_budget_affords_it() -> None:
    """DeepLabV3+'s fp32 tune where the fused update in channels_last passed first: the 1x1 GEMM was
    never judged alone, so only judging it now says it is the part that fails."""
    baseline, trials = _deeplab_like()
    trials[3].parity = NOT_REACHED
    trials[2].parity = "ok (rel 1e-05 <= 1e-04, 12 steps)"
    judged: list[str] = []

    def passes(trial: Trial) -> bool:
        judged.append(trial.label)
        return trial.label != "pointwise_conv=gemm"
    assert without_failed_parts(trials, trials[0], baseline, 0.02, PartJudge(passes=passes)) is None   # unaffordable
    assert judged == []
    rescue = without_failed_parts(trials, trials[0], baseline, 0.02,
                                  PartJudge(passes=passes, affordable=lambda trial: True))
    assert rescue is not None and rescue.label == "all faster - pointwise_conv=gemm"
    assert judged == ["fused_optimizer", "pointwise_conv=gemm"]    # the layout and the taps passed judging


def test_the_rescue_must_hold_every_setting_of_the_winner() -> None:
    baseline, trials = _deeplab_like()
    winner = _trial("threads=1", "ok", 0.95, intra_op_threads=1)
    assert without_failed_parts(trials + [winner], winner, baseline, 0.02) is None
    assert without_failed_parts(trials, baseline, baseline, 0.02) is not None   # eager won: anything faster may


def test_the_rescue_replaces_the_winner_unless_it_measured_slower() -> None:
    baseline, trials = _deeplab_like()
    rescue = without_failed_parts(trials, trials[0], baseline, 0.02)
    assert rescue is not None
    rescue.step_times, rescue.step_rounds = [0.84 * t for t in baseline.step_times], list(range(8))
    assert keeps_rescue(rescue, trials[0], baseline)
    rescue.step_times = [1.2 * t for t in baseline.step_times]
    assert not keeps_rescue(rescue, trials[0], baseline)


def _se_resnext_zen3_like() -> tuple[Trial, list[Trial]]:
    """SE-ResNeXt's fp32 tune on a Zen 3: channels_last and the formulations timed in it fail the
    trajectory (aten's channels-last batch norm), the two-pass batch norm in channels_last passes
    and wins alone; the combination without it failed."""
    baseline = _trial("eager", "reference", 1.0)
    layout = _trial("channels_last", "REJECTED (loss rel diff 2.02e-04 > ..)", 0.66, channels_last=True)
    gemm = _trial("pointwise_conv=gemm", "REJECTED (..)", 0.64, channels_last=True, pointwise_conv="gemm")
    fused = _trial("fused_optimizer", "ok", 0.97, **FUSED)
    two_pass = _trial("batch_norm=two_pass", "ok (..); check_parity ok (..)", 0.78, channels_last=True,
                      batch_norm="two_pass")
    combined = _trial("all faster", "REJECTED (loss rel diff 2.01e-04 > ..)", 0.64, channels_last=True,
                      pointwise_conv="gemm", **FUSED)
    return baseline, [layout, gemm, fused, two_pass, combined]


def test_the_failed_combination_is_proposed_with_the_winner_on_top() -> None:
    baseline, trials = _se_resnext_zen3_like()
    repaired = with_winner(trials, trials[3], baseline)
    assert repaired is not None and repaired.label == "all faster + batch_norm=two_pass"
    assert repaired.strategy.changes_from(BASE) == {"channels_last": True, "pointwise_conv": "gemm",
                                                    "batch_norm": "two_pass", **FUSED}


def test_no_winner_on_top_when_eager_won_it_conflicts_or_was_timed() -> None:
    baseline, trials = _se_resnext_zen3_like()
    assert with_winner(trials, baseline, baseline) is None                       # nothing to add
    trials[-1] = _trial("all faster", "REJECTED (..)", 0.64, channels_last=True, intra_op_threads=2, **FUSED)
    one_thread = _trial("threads=1", "ok", 0.95, intra_op_threads=1)
    assert with_winner(trials + [one_thread], one_thread, baseline) is None      # a field set otherwise
    baseline, trials = _se_resnext_zen3_like()
    timed = _trial("timed", "ok", 0.6, channels_last=True, pointwise_conv="gemm", batch_norm="two_pass", **FUSED)
    assert with_winner(trials + [timed], trials[3], baseline) is None            # already timed
    trials[-1].parity = "ok (..); check_parity ok"                              # the combination passed
    assert with_winner(trials, trials[3], baseline) is None
