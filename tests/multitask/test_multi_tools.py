"""The autotuner's trials and the profiler run on a multi-problem run."""
from __future__ import annotations

from mm_helpers import tiny_run
from hotloop.engine import Strategy
from hotloop.problems.mixing import task_of
from hotloop.tools.autotune import read_batches, tune
from hotloop.tools.profile import profile_training
from hotloop.tools.proposals import Proposal


def test_tune_times_a_graph_candidate_on_mixed_batches():
    run = tiny_run()
    batches, _ = read_batches(run.problem, run.hp, 6, run.model.task_tokens.weight.device)
    assert len({task_of(b) for b in batches}) > 1                 # the trials see several tasks
    graph = Proposal("graph per task", {"backend": "graph"}, "test: one capture per task",
                     expected_gain=1.0)
    report = tune(run.model, run.problem, run.hp, "cpu", planned_steps=10**6, cache=False,
                  max_seconds=12, num_batches=6, warmup=3, max_trial_steps=3, log=lambda line: None,
                  extra_proposals=[graph])
    trials = {t.label: t for t in report.trials}
    assert trials["eager"].measured
    assert trials["graph per task"].steps_run > 0, trials["graph per task"].status
    assert not trials["graph per task"].status.startswith(("failed", "fell back")), trials["graph per task"].status


def test_profile_runs_on_a_multi_problem():
    run = tiny_run()
    report = profile_training(run.model, run.problem, run.hp, Strategy(prefetch=0), steps=3, warmup=1,
                              profiled_steps=2)
    assert report.steps == 3 and report.step_seconds > 0
    assert report.flops_per_step > 0
