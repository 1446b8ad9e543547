"""docs/guide.md's "own model on your own DataLoader" block runs as written, with at most 10 lines of hotloop."""
from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _snippet() -> str:
    text = GUIDE.read_text()
    found = re.search(r"<!-- snippet: dataloader[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert found, "the dataloader snippet is missing from docs/guide.md"
    return found.group(1)


def test_the_guide_snippet_trains_resumes_and_is_short(tmp_path, monkeypatch):
    code = _snippet()
    hotloop_part = code.split("# hotloop\n", 1)[1]
    lines = [line for line in hotloop_part.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 10, lines
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, str(GUIDE), "exec"), scope)
    result = scope["result"]
    assert result.steps == 32 and result.epochs == 2
    assert (tmp_path / "runs" / "mine" / "checkpoints").is_dir()
    again = scope["Trainer"](scope["loader"], scope["model"], scope["HParams"](learning_rate=1e-2, max_epochs=2),
                             loss_fn=scope["loss_fn"], output_dir="runs/mine", loggers=[])
    assert again.fit(resume=True).steps == 32          # already done: resume changes nothing
