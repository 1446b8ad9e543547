"""The autotuner's trials and the profiler run on a multi-problem run."""
from __future__ import annotations

import torch

from mm_helpers import tiny_run
from hotloop.engine import Strategy
from hotloop.problems.mixing import task_of
from hotloop.tools.autotune import read_batches, tune
from hotloop.tools.profile import profile_training
from hotloop.tools.trials import Trial, TrialRunner


def test_tune_runs_on_a_multi_problem(monkeypatch):
    import hotloop.tools.autotune as autotune
    monkeypatch.setattr(autotune, "propose", lambda *a, **k: [])   # the eager baseline only: fast
    run = tiny_run()
    report = tune(run.model, run.problem, run.hp, "cpu", planned_steps=10_000, cache=False, max_seconds=3,
                  num_batches=6, warmup=1, max_trial_steps=3, log=lambda line: None)
    assert report.trials[0].label == "eager" and report.trials[0].measured
    assert report.strategy.backend == "eager"


def test_graph_trial_on_mixed_batches_captures_each_task_once():
    run = tiny_run()
    batches, _ = read_batches(run.problem, run.hp, 6, torch.device("cpu"))
    tasks = [task_of(b) for b in batches]
    assert len(set(tasks)) == 3                                  # the trial batches mix the tasks
    runner = TrialRunner(run.model, run.hp, batches, torch.device("cpu"), warmup=len(batches))
    graph = Trial("graph", Strategy(backend="graph"), "test")
    eager = Trial("eager", Strategy(), "test")
    assert runner.prepare(graph) and runner.prepare(eager)
    for _ in range(len(batches) + 3):                            # every task in warm-up, then timed
        runner.step(graph)
        runner.step(eager)
    assert graph.status == "ok" and len(graph.step_times) == 3
    assert graph.runner.step.captures == 3                       # one per task, none when timed
    assert torch.allclose(torch.tensor(graph.losses), torch.tensor(eager.losses), rtol=1e-4, atol=1e-5)


def test_profile_runs_on_a_multi_problem():
    run = tiny_run()
    report = profile_training(run.model, run.problem, run.hp, Strategy(prefetch=0), steps=3, warmup=1,
                              profiled_steps=2)
    assert report.steps == 3 and report.step_seconds > 0
    assert report.flops_per_step > 0
