"""Fail a CI run whose tests skipped for any reason but a missing CUDA device.

Reads the JUnit XML file that ``pytest --junitxml=FILE`` writes, prints every skip with its
reason, and exits 1 when a skip is unexpected. A skip is expected when its reason matches
:data:`CUDA_ONLY` (the test needs a CUDA device, or checks what happens without one), or a
pattern given with ``--allow`` (the portability pass allows the CPU features it caps); the rule
is on the reason, never on test names, so new CUDA-only tests pass without an edit here.
A skip for a package that cannot be imported is always unexpected: the ``[test]`` extra
installs every package the tests use, so a broken install is a failure, never a green run.
Expected failures (``xfail``) are not skips and are not counted.

Usage::

    python -m pytest -q -rs --junitxml=junit.xml
    python .ci/check_skips.py junit.xml [--allow REGEX ...]
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["CUDA_ONLY", "MISSING_PACKAGE", "Skip", "read_skips", "unexpected", "main"]

#: reasons of skips allowed in every CI run: the test needs CUDA (there is no GPU in CI): "needs CUDA",
#: "needs 2 GPUs", "NCCL only" (any case)
CUDA_ONLY = re.compile(r"\b(CUDA|GPUs?|NCCL)\b", re.IGNORECASE)
#: reasons that mean a package could not be imported (never allowed)
MISSING_PACKAGE = re.compile(r"could not import|No module named|ModuleNotFoundError|ImportError")


@dataclass(frozen=True)
class Skip:
    """One skipped test (or a skipped module, at collection) and the reason pytest gave."""

    test: str
    reason: str


def _reason(element: ET.Element) -> str:
    """The reason of one ``<skipped>`` element (a module skipped at collection keeps it in the text)."""
    message = element.get("message", "")
    text = (element.text or "").strip()
    if message == "collection skipped" and text:
        try:
            _, _, reason = ast.literal_eval(text)       # (path, line, "Skipped: reason")
        except (ValueError, SyntaxError, TypeError):
            reason = text
        return str(reason).removeprefix("Skipped: ")
    return message or text


def read_skips(junit_xml: str | Path) -> list[Skip]:
    """Every skip (xfail excluded) in a pytest JUnit XML report."""
    root = ET.parse(junit_xml).getroot()
    found = []
    for case in root.iter("testcase"):
        for element in case.findall("skipped"):
            if element.get("type") == "pytest.xfail":
                continue
            name = "::".join(part for part in (case.get("classname", ""), case.get("name", "")) if part)
            found.append(Skip(name, _reason(element)))
    return found


def unexpected(skips: list[Skip], allow: Sequence[str] = ()) -> list[Skip]:
    """The skips whose reason is no CUDA-only (or ``allow``) reason, and every missing-package skip."""
    extra = [re.compile(p) for p in allow]
    return [s for s in skips if MISSING_PACKAGE.search(s.reason)
            or not (CUDA_ONLY.search(s.reason) or any(p.search(s.reason) for p in extra))]


def main(argv: list[str] | None = None) -> int:
    """Print the skip summary; 0 when only expected skips happened, 1 otherwise, 2 for a bad report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit_xml", help="the file pytest --junitxml wrote")
    parser.add_argument("--allow", action="append", default=[], metavar="REGEX",
                        help="also allow skips whose reason matches REGEX (repeatable)")
    args = parser.parse_args(argv)
    try:
        skips = read_skips(args.junit_xml)
    except (OSError, ET.ParseError) as exc:
        print(f"check_skips: cannot read {args.junit_xml}: {exc}", file=sys.stderr)
        return 2
    bad = unexpected(skips, args.allow)
    print(f"skip summary: {len(skips)} skipped, {len(skips) - len(bad)} expected, {len(bad)} unexpected")
    for skip in skips:
        print(f"  {'UNEXPECTED' if skip in bad else 'expected  '} {skip.test}: {skip.reason}")
    if bad:
        print("check_skips: tests skipped for a reason other than a missing CUDA device; a skip for a "
              "missing package or missing data is a failure in CI", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
