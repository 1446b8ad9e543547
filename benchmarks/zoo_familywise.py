"""Read saved ``benchmarks/zoo.py`` tables family-wise (:func:`zoo_stats.familywise`).

    python benchmarks/zoo_familywise.py docs/data/zoo_fp32_epyc_share.json [more.json ...] [--json FILE]

For each table: the per-row verdicts against the expert loop (and the A/A control where the table
has one) and the same rows read as one claim, each bound widened to the Sidak level.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo_stats import familywise, familywise_text, verdict_text, verdicts  # noqa: E402

__all__ = ["read_table"]


def read_table(table: dict[str, Any]) -> dict[str, Any]:
    """Per-row verdicts and family-wise reading of one saved zoo table, vs the expert and the control."""
    rows = table["rows"]
    out: dict[str, Any] = {}
    for key, name in (("vs_expert_paired", "vs_expert"), ("control_paired", "control")):
        if rows and all(key in r for r in rows):
            out[name] = {"per_row": verdicts(rows, key), "familywise": familywise(rows, key)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", metavar="ZOO_JSON")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    found = {}
    for path in args.tables:
        try:
            table = json.loads(Path(path).read_text())
            found[path] = read_table(table)
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"zoo_familywise: {path}: not a zoo table ({type(err).__name__}: {err})", file=sys.stderr)
            return 2
        print(f"{path} (precision {table.get('precision')}):")
        for name, reading in found[path].items():
            print(f"  {name}, 90% per row: {verdict_text(reading['per_row'])}")
            print("  " + familywise_text(reading["familywise"], "the expert loop" if name == "vs_expert"
                                         else "the expert loop, control"))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
