"""The JSON parts of ``benchmarks/gpu_check.sh`` and the ``docs/gpu.md`` made from them.

    python benchmarks/gpu_report.py --machine cuda --json OUT/machine.json   # the machine's facts
    python benchmarks/gpu_report.py --junit tests.xml --json OUT/tests.json  # pytest's junit XML, summarised
    python benchmarks/gpu_report.py --run-dir RUN --json OUT/default.json    # a hotloop run: steps, time, metrics
    python benchmarks/gpu_report.py OUT > docs/gpu.md                        # the report from OUT's JSON

The junit XML is parsed with ``xml.etree`` from a file pytest wrote in this job (not data from
elsewhere). Every number in the report comes from a JSON file of OUT, named next to it.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

__all__ = ["machine_facts", "junit_summary", "run_summary", "render"]


def machine_facts(device: str) -> dict[str, Any]:
    """torch, Python, CPU and (on cuda) the GPU's name, memory, capability and bf16 support."""
    import torch
    facts: dict[str, Any] = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
                             "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    try:
        facts["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                            if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"sm_{props.major}{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                     cuda=torch.version.cuda)
    return facts


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts and the failed / skipped cases (with their messages) of a pytest junit XML file."""
    root = ElementTree.parse(path).getroot()
    cases = list(root.iter("testcase"))
    out: dict[str, Any] = {"tests": len(cases), "failed": [], "skipped": [], "passed": 0}
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            out["failed"].append({"test": name, "message": (problem.get("message") or "")[:300]})
        elif skipped is not None:
            out["skipped"].append({"test": name, "message": (skipped.get("message") or "")[:200]})
        else:
            out["passed"] += 1
    return out


def run_summary(run_dir: Path) -> dict[str, Any]:
    """A hotloop run's last train record, last valid record and its run.json settings."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("split") == "train"]
    valid = [r for r in records if r.get("split") == "valid"]
    info = json.loads((run_dir / "run.json").read_text())
    return {"problem": info.get("problem"), "model": info.get("model"), "hparams": info.get("hparams_set"),
            "device": info.get("device"), "strategy": info.get("strategy"),
            "steps": train[-1]["step"] if train else 0, "last_train": train[-1] if train else None,
            "last_valid": valid[-1] if valid else None}


def _load(out: Path, name: str) -> Any:
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


def _zoo_table(zoo: dict[str, Any]) -> list[str]:
    lines = ["| model | size | batch x input | naive/s | expert/s | compiled/s | hotloop/s | vs naive | "
             "vs expert | vs compiled | MFU | hotloop's strategy |", "|" + "---|" * 12]
    for r in zoo["rows"]:
        comp = r.get("expert_compiled_samples_per_s")
        vs_comp = r.get("speedup_vs_expert_compiled")
        lines.append(f"| {r['model']} | {r.get('size', 'small')} | {r['batch']} x {r['input_size']} | "
                     f"{r['plain_samples_per_s']:.2f} | {r['expert_samples_per_s']:.2f} | "
                     f"{f'{comp:.2f}' if comp else '-'} | {r['hotloop_samples_per_s']:.2f} | "
                     f"{r['speedup_vs_naive']:.2f}x | {r['speedup_vs_expert']:.2f}x | "
                     f"{f'{vs_comp:.2f}x' if vs_comp else '-'} | {r['mfu']:.1%} | `{r['strategy']}` |")
    lines.append("")
    lines.append(f"Geomean: {zoo['geomean_vs_naive']:.2f}x the naive loop, {zoo['geomean_vs_expert']:.2f}x the "
                 "expert loop" + (f", {zoo['geomean_vs_expert_compiled']:.2f}x the compiled expert"
                                  if "geomean_vs_expert_compiled" in zoo else "")
                 + f" (precision {zoo['precision']}{'; SMOKE: not a measurement' if zoo.get('smoke') else ''}).")
    return lines


def render(out: Path) -> str:
    """docs/gpu.md from the JSON files in ``out`` (parts that did not run are said to be missing)."""
    rel = out.as_posix()
    machine, tests, zoo = _load(out, "machine.json"), _load(out, "tests.json"), _load(out, "zoo_full.json")
    default, fsdp, parts = _load(out, "default.json"), _load(out, "fsdp.json"), _load(out, "parts.json") or []
    lines = ["# hotloop on a GPU", "",
             "Made by `python benchmarks/gpu_report.py " + rel + "` from the JSON that `bash benchmarks/gpu_check.sh` "
             f"wrote into `{rel}/`; every number below is in one of those files.", ""]
    if machine:
        lines += ["## Machine", "", f"`{rel}/machine.json`: " + ", ".join(f"{k} {v}" for k, v in machine.items()), ""]
    calls = any("call" in p for p in parts)     # parts gathered from several device calls name theirs
    lines += ["## Parts", "", "| part | exit code | seconds (limit) |" + (" call |" if calls else ""),
              "|---|---|---|" + ("---|" if calls else "")]
    lines += [f"| {p['part']} | {p['rc']}{' (timed out)' if p['rc'] in (124, 137) else ''} | "
              f"{p['seconds']} ({p['limit']}) |" + (f" {p.get('call', '')} |" if calls else "") for p in parts]
    lines += ["", "## CUDA tests", ""]
    if tests:
        lines.append(f"`{rel}/tests.json`: {tests['tests']} tests, {tests['passed']} passed, "
                     f"{len(tests['failed'])} failed, {len(tests['skipped'])} skipped.")
        lines += [f"- failed: `{f['test']}`: {f['message']}" for f in tests["failed"]]
        lines += [f"- skipped: `{s['test']}`: {s['message']}" for s in tests["skipped"][:20]]
    else:
        lines.append("missing (the part did not write its JSON).")
    lines += ["", "## The zoo: naive, expert, expert with torch.compile, hotloop auto", ""]
    if zoo:
        lines.append(f"`{rel}/zoo_full.json` (`benchmarks/zoo.py`; precision: naive fp32, the expert bf16 where "
                     "the GPU has it, hotloop auto's choice as listed):")
        lines += [""] + _zoo_table(zoo)
    else:
        lines.append("missing.")
    gap = _load(out, "step_gap.json")
    if gap:
        lines += ["", "## hotloop's step against the expert's, same settings", "",
                  f"`{rel}/step_gap.json` (`benchmarks/step_gap.py`; batches made once, on the device):", "",
                  "| model | contender | step ms | expert's time / contender's (paired) |", "|---|---|---|---|"]
        for r in gap["rows"]:
            for key, ms in r["step_ms"].items():
                paired = r["vs_expert"].get(key)
                ratio = "-" if paired is None else (f"{paired['paired']:.3f}x ({paired['verdict']})"
                                                    if paired["paired"] else paired["verdict"])
                if key == "hotloop_fed" and "fed_vs_expert_fed" in r:     # fed loops pair with each other
                    fed = r["fed_vs_expert_fed"]
                    ratio = (f"{fed['paired']:.3f}x of expert_fed ({fed['verdict']})" if fed["paired"]
                             else f"{fed['verdict']} (of expert_fed)")
                lines.append(f"| {r['model']} | {key} | {ms:.2f} | {ratio} |")
    for title, run, name in (("The default run", default, "default.json"), ("FSDP, world size 1", fsdp, "fsdp.json")):
        lines += ["", f"## {title}", ""]
        if run:
            valid = run.get("last_valid") or {}
            train = run.get("last_train") or {}
            lines.append(f"`{rel}/{name}`: {run['problem']} x {run['model']}, {run['steps']} steps, "
                         f"{train.get('time', float('nan')):.1f} s of training; valid " +
                         ", ".join(f"{k} {v:.4g}" for k, v in valid.items() if isinstance(v, float)))
        else:
            lines.append("missing.")
    notes = out / "notes.md"      # a hand-written reading of these numbers, kept beside them
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="a gpu_check.sh output folder: print docs/gpu.md from it")
    parser.add_argument("--machine", metavar="DEVICE")
    parser.add_argument("--junit", type=Path)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--json", type=Path, help="where --machine / --junit / --run-dir write their JSON")
    args = parser.parse_args(argv)
    if args.out:
        sys.stdout.write(render(Path(args.out)))
        return 0
    if args.json is None:
        parser.error("--machine, --junit and --run-dir need --json FILE")
    if args.machine:
        data = machine_facts(args.machine)
    elif args.junit:
        data = junit_summary(args.junit)
    elif args.run_dir:
        data = run_summary(args.run_dir)
    else:
        parser.error("nothing to do: give OUT, --machine, --junit or --run-dir")
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
