"""Every number in the docs has its artifact: each ``docs/data/*.json`` the README and ``docs/`` cite
exists and parses, and every bullet of the README's "Measured" section cites one."""
from __future__ import annotations

import glob
import itertools
import json
import re
from pathlib import Path

from helpers import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs").glob("*/*.md"))]
#: a cited file: docs/data/<name>.json, <name> may hold {a,b} alternatives or a * pattern
CITED = re.compile(r"docs/data/([A-Za-z0-9_.{},*<>|/-]+?\.json)(?![A-Za-z])")


def _expand(name: str) -> list[str]:
    """``ladder_{a,b}.json`` -> ``ladder_a.json``, ``ladder_b.json``."""
    parts = re.split(r"\{([^{}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def cited_files(text: str) -> list[str]:
    """The docs/data JSON files ``text`` cites as sources (a command's ``--json`` output and
    ``<placeholder>`` names are files to make, not sources)."""
    out = []
    for match in CITED.finditer(text):
        before = text[max(0, match.start() - 16):match.start()]
        if re.search(r"--[a-z_]*json[ =]$", before) or "<" in match.group(1):
            continue
        out += _expand(match.group(1))
    return out


def test_the_citation_parser_expands_and_skips():
    text = ("see `docs/data/ladder_{small,large}.json` and docs/data/zoo.json; "
            "run `x.py --json docs/data/new.json` or `--baseline_json docs/data/ladder_<config>.json`")
    assert cited_files(text) == ["ladder_small.json", "ladder_large.json", "zoo.json"]


def test_every_cited_json_exists_and_parses():
    missing, broken = [], []
    for doc in DOCS:
        for name in cited_files(doc.read_text(encoding="utf-8")):
            paths = glob.glob(str(REPO / "docs" / "data" / name))
            if not paths:
                missing.append(f"{doc.relative_to(REPO)}: docs/data/{name}")
            for path in paths:
                try:
                    json.loads(Path(path).read_text(encoding="utf-8"))
                except ValueError as exc:
                    broken.append(f"{path}: {exc}")
    assert not missing, "cited but not in docs/data/:\n" + "\n".join(missing)
    assert not broken, "\n".join(broken)


def _measured_bullets(readme: str) -> list[str]:
    section = readme.split("\n## Measured", 1)[1].split("\n## ", 1)[0]
    bullets, current = [], None
    for line in section.splitlines():
        if line.startswith("- "):
            current = [line]
            bullets.append(current)
        elif current is not None and line.startswith("  "):
            current.append(line)
        else:
            current = None
    return [" ".join(b) for b in bullets]


def test_every_measured_bullet_of_the_readme_cites_its_json():
    bullets = _measured_bullets((REPO / "README.md").read_text(encoding="utf-8"))
    assert bullets
    uncited = [b[:120] for b in bullets if re.search(r"\d", b) and not cited_files(b)]
    assert not uncited, "README numbers without a docs/data JSON:\n" + "\n".join(uncited)
