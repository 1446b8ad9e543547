"""Metrics from summed statistics, and the console / JSONL / progress-bar loggers."""
from __future__ import annotations

import io
import json
import math

import torch

from helpers import make_trainer
from hotloop.engine import Strategy
from hotloop.train.loggers import ConsoleLogger, JsonlLogger, ProgressBar
from hotloop.train.metrics import StatsAccumulator, summarize


def test_accumulator_sums_on_device_and_reads_once():
    acc = StatsAccumulator()
    acc.add({"nll_sum": torch.tensor(6.0), "tokens": torch.tensor(3), "examples": torch.tensor(2),
             "correct": torch.tensor(2), "seq_correct": torch.tensor(1)})
    acc.add({"nll_sum": torch.tensor(2.0), "tokens": torch.tensor(1), "examples": torch.tensor(2),
             "correct": torch.tensor(1), "seq_correct": torch.tensor(0)})
    assert acc.host_syncs == 0
    m = summarize(acc.read())
    assert acc.host_syncs == 1 and not acc  # reset after reading
    assert m["loss"] == 2.0 and math.isclose(m["ppl"], math.exp(2.0))
    assert m["accuracy"] == 0.75 and m["seq_accuracy"] == 0.25 and m["tokens"] == 4


def test_reduce_hook_is_applied_before_reading():
    acc = StatsAccumulator()
    acc.add({"nll_sum": torch.tensor(1.0), "tokens": torch.tensor(1)})
    doubled = acc.read(lambda s: {k: v * 2 for k, v in s.items()})
    assert doubled == {"nll_sum": 2.0, "tokens": 2.0}


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_console_lines_and_progress_bar_only_on_tty(tmp_path):
    plain, tty = _Stream(False), _Stream(True)
    make_trainer(None, max_steps=4, strategy=Strategy(prefetch=0, sync_every=2),
                 loggers=[ConsoleLogger(plain), ProgressBar(plain), ProgressBar(tty)]).fit()
    lines = plain.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("train")] == ["step=2", "step=4"]
    assert any(ln.startswith("valid") and "seq_accuracy=" in ln for ln in lines)
    assert "\r" not in plain.getvalue()  # no progress bar when not a TTY
    assert "\r" in tty.getvalue() and "/4" in tty.getvalue()  # drawn with the step count


def test_jsonl_drops_rows_newer_than_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"split": "train", "step": s}) + "\n" for s in (2, 4, 6)))
    logger = JsonlLogger(path)
    logger._open(resumed_step=4)
    logger.write({"split": "train", "step": 6, "loss": float("inf")})
    logger._file.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6] and rows[-1]["loss"] is None  # inf -> null (valid JSON)


def test_tensorboard_logger_writes_scalars_when_available(monkeypatch, tmp_path):
    import sys
    import types
    written: list[tuple[str, float, int]] = []

    class FakeWriter:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def close(self):
            written.append(("closed", 0.0, 0))

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    from hotloop.train.loggers import TensorBoardLogger
    make_trainer(None, max_steps=2, strategy=Strategy(prefetch=0, sync_every=2),
                 loggers=[TensorBoardLogger(tmp_path / "tb")]).fit()
    tags = {t for t, _, _ in written}
    assert {"train/loss", "train/lr", "valid/loss", "valid/seq_accuracy", "closed"} <= tags
    assert all(step == 2 for t, _, step in written if t != "closed")


def test_evaluation_time_is_left_out_of_the_next_rows_speed(tmp_path):
    import time as clock

    from hotloop.train import Callback, Event

    class SlowEval(Callback):
        def on_event(self, event, trainer, **info):
            if event is Event.EVAL_END:
                clock.sleep(3.0)          # ~100x the 4 tiny steps of a window (~0.03 s)

    trainer = make_trainer(tmp_path, max_steps=12, eval_every=4, strategy=Strategy(prefetch=0, sync_every=4),
                           callbacks=[SlowEval()])
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    speed = {r["step"]: r["tokens_per_s"] for r in rows if r["split"] == "train"}
    # rows 8 and 12 follow an evaluation that slept 3 s; counted in, it would cut their speed ~100x, while a
    # busy machine slows a window of tiny steps by well under 20x
    assert speed[8] > speed[4] / 20 and speed[12] > speed[4] / 20, speed
