"""Mutation check, run by hand (not by pytest, not in CI): do the tests catch what they guard?

Each :class:`Mutation` replaces one piece of source text (it must occur exactly once) in a
scratch copy of the repository and runs the tests named for it there, with ``PYTHONPATH``
pointing at the copy. A mutation is *caught* when at least one of its tests fails; the
table names which. Every test is first run unmutated (the baseline), so a test that
already fails is reported, not counted as a catch. Nothing in the working tree changes.

Usage (from the repository root, in the project's virtualenv)::

    python tests/mutations.py                 # every mutation, on a copy of the working tree
    python tests/mutations.py --rev HEAD      # on a copy of a commit (``git archive``)
    python tests/mutations.py --only nms_threshold --only beam_reorder_by_rank

It prints a Markdown table (docs/mutations.md keeps the last one). The file name does
not match ``test_*.py``, so pytest never collects it.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Mutation", "MUTATIONS", "Outcome", "scratch_copy", "run_tests", "check", "main"]

REPO = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", "runs")


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (exactly one occurrence) by ``new`` in ``path``; ``tests`` should catch it."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str = ""


DP_STOP = "tests/parallel/test_dp_nonfinite.py::test_stop_halts_both_ranks_at_the_same_step_and_names_the_other_rank"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("accum_equal_weights", "hotloop/engine/step_parts.py",
             "weight = out.weight if out.weight is not None else out.loss.new_ones(())",
             "weight = out.loss.new_ones(())",
             ("tests/engine/test_accumulation_weights.py",
              "tests/train/test_trainer_loop.py::test_accumulation_matches_the_big_batch_step"),
             "accumulation weights micro-batches equally instead of by their tokens"),
    Mutation("accum_divide_by_count", "hotloop/engine/step.py",
             "torch._foreach_div_(grads, weight)", "torch._foreach_div_(grads, float(n))",
             ("tests/engine/test_accumulation_weights.py",
              "tests/train/test_trainer_loop.py::test_accumulation_matches_the_big_batch_step"),
             "summed weighted gradients divided by the micro-batch count, not the summed weights"),
    Mutation("beam_reorder_by_rank", "hotloop/decode/search.py",
             "state = state.reorder((row_base + origin.gather(1, pick)).reshape(-1))",
             "state = state.reorder((row_base + torch.arange(k, device=device)).reshape(-1))",
             ("tests/decode/test_decode_search.py",),
             "the decoder cache of beam row r stays row r's (by rank), not the survivor's origin beam"),
    Mutation("beam_reorder_by_candidate_index", "hotloop/decode/search.py",
             "state = state.reorder((row_base + origin.gather(1, pick)).reshape(-1))",
             "state = state.reorder((row_base + pick).reshape(-1))",
             ("tests/decode/test_decode_search.py",),
             "the decoder cache is picked by the survivor's index among the 2K candidates"),
    Mutation("beam_eos_outside_top_k", "hotloop/decode/search.py",
             "new_fin = torch.where(is_eos & in_top_k & ~done[:, None],",
             "new_fin = torch.where(is_eos & ~done[:, None],",
             ("tests/decode/test_decode_search.py",),
             "an EOS candidate ranked below the top K still finishes"),
    Mutation("nms_threshold", "hotloop/ops/nms.py",
             "over = (iou > iou_threshold) & earlier", "over = (iou >= iou_threshold) & earlier",
             ("tests/ops/test_ops_nms.py",),
             "NMS suppresses at IoU equal to the threshold"),
    Mutation("clip_skipped_on_cpu", "hotloop/engine/clipping.py",
             'if all(g.device.type == "cpu" for g in grads) and bool(plain(factor) == 1.0):',
             'if all(g.device.type == "cpu" for g in grads):',
             ("tests/engine/test_clipping.py",),
             "clip by global norm never scales CPU gradients"),
    Mutation("clip_factor_no_cap", "hotloop/engine/clipping.py",
             "torch.clamp(max_norm / (total + 1e-6), max=1.0)", "max_norm / (total + 1e-6)",
             ("tests/engine/test_clipping.py",),
             "the clip factor may exceed 1 (small gradients are scaled up)"),
    Mutation("resume_torch_rng", "hotloop/train/stateful.py",
             'torch.set_rng_state(state["torch"])', 'torch.get_rng_state()',
             ("tests/train/test_resume.py",),
             "resume does not restore the torch RNG"),
    Mutation("resume_numpy_rng", "hotloop/train/stateful.py",
             'np.random.set_state(tuple(decode_plain(state["numpy"])))', 'np.random.get_state()',
             ("tests/train/test_resume.py",),
             "resume does not restore the numpy RNG"),
    Mutation("resume_python_rng", "hotloop/train/stateful.py",
             "random.setstate((version, tuple(internal), gauss))", "random.getstate()",
             ("tests/train/test_resume.py",),
             "resume does not restore Python's random module"),
    Mutation("resume_v1_drops_carried_state", "hotloop/train/snapshot.py",
             '"carried": payload["state"],', '"carried": None,',
             ("tests/train/test_checkpoint_components.py::test_a_version_1_checkpoint_resumes_bitwise",),
             "a version-1 checkpoint resumes without the model state it carried mid-stream"),
    Mutation("checkpoint_version_unchecked", "hotloop/train/snapshot.py",
             "if version not in READABLE_VERSIONS:", "if False:",
             ("tests/train/test_checkpoint_components.py",),
             "a checkpoint of an unknown format version loads as if it were the current one"),
    Mutation("hparams_import_from_data", "hotloop/hparams.py",
             "cls = resolve_hparams_class(qual)",
             'cls = getattr(__import__(qual.partition(":")[0], fromlist=["_"]), qual.partition(":")[2])',
             ("tests/core/test_no_import_from_data.py",),
             "hparams_from_dict imports the module a checkpoint or manifest names"),
    Mutation("resume_skips_class_check", "hotloop/train/snapshot.py",
             '_check_hparams_class(meta["hparams"], hp, path)', "pass",
             ("tests/core/test_no_import_from_data.py::test_resume_refuses_a_planted_checkpoint",),
             "--resume accepts a checkpoint naming an unknown hparams class"),
    Mutation("config_adds_imports", "hotloop/compose/config.py",
             "_check_imports(path, value)", "pass",
             ("tests/core/test_no_import_from_data.py::test_config_file_cannot_add_imports",),
             "a config file's `imports` imports modules the command line did not"),
    Mutation("nonfinite_no_rank_agreement", "hotloop/train/trainer.py",
             "reduce=self.dist.all_reduce_stats,", "reduce=lambda stats: stats,",
             (DP_STOP,),
             "the log window's statistics (and the non-finite flags) are not summed across ranks"),
    Mutation("nonfinite_other_rank_message", "hotloop/train/nonfinite.py",
             'where = f"at step {exact}" if exact >= 0 else "on another rank"', 'where = f"at step {exact}"',
             (DP_STOP,),
             "a rank stopped by another rank's non-finite loss names a step of its own"),
    Mutation("nonfinite_counted_per_rank", "hotloop/train/window.py",
             'math.ceil(int(round(sums["_nonfinite"])) / world_size)', 'int(round(sums["_nonfinite"]))',
             ("tests/parallel/test_dp_nonfinite.py",),
             "a non-finite step flagged by both ranks counts twice"),
    Mutation("skip_not_discarded_in_a_phase", "hotloop/train/nonfinite.py",
             "found = list(inner.values()) if isinstance(inner, dict) else [optimizer]",
             "found = list(inner.values())[:1] if isinstance(inner, dict) else [optimizer]",
             ("tests/train/test_nonfinite_phases.py",),
             "skip guards only the first phase's optimizer of a phased step"),
    Mutation("hparams_from_file_untyped", "hotloop/hparams.py",
             "    return cls(**{k: typed_value(k, v, types_[k]) for k, v in data.items()})",
             "    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})",
             ("tests/fuzz/test_fuzz_checkpoints.py::test_edited_checkpoint_contents",),
             "hparams read from a checkpoint keep values of the wrong type"),
    Mutation("checkpoint_meta_not_mapping", "hotloop/train/checkpoint.py",
             'if not isinstance(payload["meta"], dict):', "if False:",
             ("tests/fuzz/test_fuzz_checkpoints.py::test_edited_checkpoint_contents",),
             "a checkpoint whose metadata is not a mapping loads"),
    Mutation("checkpoint_run_unchecked", "hotloop/compose/restore.py",
             "run = _run_record(path, meta)", 'run = meta.get("run") or {}',
             ("tests/fuzz/test_fuzz_checkpoints.py::test_edited_checkpoint_contents",),
             "eval/decode read a checkpoint's run record without checking its names are text"),
    Mutation("tune_cache_untyped", "hotloop/tools/tune_cache.py",
             "return Strategy.from_mapping(data)", "return Strategy(**data)",
             ("tests/fuzz/test_fuzz_data_files.py::test_mutated_tune_cache_files",),
             "a tune-cache file's Strategy fields are not checked by type"),
    Mutation("shard_manifest_unchecked", "hotloop/data/shards.py",
             "    _check_entries(path, manifest)", "    pass",
             ("tests/fuzz/test_fuzz_data_files.py::test_mutated_data_shards",),
             "a prepared-data manifest with malformed entries is read"),
    Mutation("export_manifest_unchecked", "hotloop/export/artifacts.py",
             "if not isinstance(manifest[key], kind):", "if False:",
             ("tests/fuzz/test_fuzz_data_files.py::test_mutated_export_directories",),
             "an export manifest whose parts have the wrong type is read"),
    Mutation("config_counts_unchecked", "hotloop/cli/train.py",
             "    check_counts(vars(args))", "    pass",
             ("tests/fuzz/test_fuzz_text_inputs.py::test_config_files",),
             "a config file's keep_last 0 (or a negative count) reaches the Trainer"),
    Mutation("ci_allows_missing_packages", ".ci/check_skips.py",
             "return [s for s in skips if MISSING_PACKAGE.search(s.reason)",
             "return [s for s in skips if False",
             ("tests/test_ci_check_skips.py",),
             ".ci/run accepts a skip for a missing package whose reason mentions CUDA"),
)


@dataclass
class Outcome:
    """What one mutation's test run found."""

    mutation: Mutation
    failed: list[str] = field(default_factory=list)     # tests that failed under the mutation
    error: str = ""                                     # the mutation could not be applied / run
    seconds: float = 0.0

    @property
    def caught(self) -> bool:
        return bool(self.failed) and not self.error


def scratch_copy(dest: Path, rev: str | None) -> Path:
    """The working tree (``rev`` None) or commit ``rev`` copied to ``dest/repo``."""
    target = dest / "repo"
    if rev is None:
        shutil.copytree(REPO, target, ignore=IGNORED)
        return target
    archive = dest / "repo.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], check=True, stdout=fh)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, list[str], str]:
    """Run pytest on ``tests`` inside ``copy``: (exit code, failed test ids, output tail)."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    env.setdefault("HOTLOOP_RAW_ROOT", str(REPO.parent / "shared" / "data"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, [], "timed out"
    output = proc.stdout + proc.stderr
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)))
    return proc.returncode, failed, output[-2000:]


def _imported_package(copy: Path) -> str:
    """The ``hotloop`` package that tests in ``copy`` import (must be the copy's)."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    out = subprocess.run([sys.executable, "-c", "import hotloop; print(hotloop.__file__)"], cwd=copy, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


def check(mutation: Mutation, copy: Path, baseline_failed: set[str], timeout: float) -> Outcome:
    """Apply ``mutation`` in ``copy``, run its tests, restore the file."""
    path = copy / mutation.path
    original = path.read_text(encoding="utf-8")
    if original.count(mutation.old) != 1:
        return Outcome(mutation, error=f"old text found {original.count(mutation.old)} times in {mutation.path}")
    start = time.perf_counter()
    path.write_text(original.replace(mutation.old, mutation.new), encoding="utf-8")
    try:
        code, failed, tail = run_tests(copy, mutation.tests, timeout)
    finally:
        path.write_text(original, encoding="utf-8")
    outcome = Outcome(mutation, [t for t in failed if t not in baseline_failed],
                      seconds=time.perf_counter() - start)
    if code not in (0, 1):
        outcome.error = f"pytest exit code {code}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
    return outcome


def _table(outcomes: list[Outcome], baseline_failed: set[str]) -> str:
    rows = ["| mutation | file | what it breaks | tests run | caught by | result |",
            "|---|---|---|---|---|---|"]
    for o in outcomes:
        m = o.mutation
        caught_by = "<br>".join(f"`{t}`" for t in o.failed) or "-"
        result = f"error: {o.error}" if o.error else ("caught" if o.caught else "**survived**")
        rows.append(f"| `{m.name}` | `{m.path}` | {m.why} | " + "<br>".join(f"`{t}`" for t in m.tests)
                    + f" | {caught_by} | {result} ({o.seconds:.0f} s) |")
    if baseline_failed:
        rows.append("")
        rows.append("Failing before any mutation (not counted): " + ", ".join(sorted(baseline_failed)))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the mutations; print the Markdown table; exit 1 if any survived or could not run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default=None, help="copy this commit (git archive) instead of the working tree")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these mutations")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s) {sorted(unknown)}; known: {[m.name for m in MUTATIONS]}")
    with tempfile.TemporaryDirectory(prefix="hotloop-mutations-") as tmp:
        copy = scratch_copy(Path(tmp), args.rev)
        imported = _imported_package(copy)
        if not imported.startswith(str(copy)):
            print(f"the copy imports hotloop from {imported}, not from {copy}", file=sys.stderr)
            return 2
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        code, baseline, tail = run_tests(copy, tests, args.timeout)
        if code not in (0, 1):
            print(f"baseline run failed to run (exit {code}):\n{tail}", file=sys.stderr)
            return 2
        outcomes = []
        for mutation in chosen:
            outcomes.append(check(mutation, copy, set(baseline), args.timeout))
            o = outcomes[-1]
            status = o.error or ("caught by " + ", ".join(o.failed) if o.caught else "SURVIVED")
            print(f"{mutation.name}: {status}", file=sys.stderr, flush=True)
    print(_table(outcomes, set(baseline)))
    return 0 if all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
