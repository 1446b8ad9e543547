"""Loggers are callbacks: console lines, ``metrics.jsonl``, CSV, TensorBoard, a TTY progress bar.

Weights & Biases and MLflow live in :mod:`hotloop.train.tracking`.
"""
from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .events import Callback, Event

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

__all__ = ["ConsoleLogger", "JsonlLogger", "CsvLogger", "TensorBoardLogger", "ProgressBar", "format_row",
           "default_loggers"]


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key in ("lr",):
            return f"{key}={value:.3g}"
        if key.endswith("_per_s"):
            return f"{key}={value:.0f}"
        if math.isinf(value) or abs(value) >= 1e4:
            return f"{key}={value:.4g}"
        return f"{key}={value:.4f}"
    return f"{key}={value}"


def format_row(row: dict[str, Any], skip: tuple[str, ...] = ("split", "time")) -> str:
    """One readable line: ``step=100 epoch=0 loss=1.2345 ...``."""
    return " ".join(_fmt(k, v) for k, v in row.items() if k not in skip)


class ConsoleLogger(Callback):
    """Prints each training log row and each evaluation to ``stream``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def _print(self, text: str) -> None:
        stream = self.stream or sys.stdout
        prefix = "\r\033[K" if stream.isatty() else ""
        print(prefix + text, file=stream, flush=True)

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.LOG:
            row = {k: v for k, v in info["row"].items() if not (k == "nonfinite_steps" and v == 0)}
            self._print("train " + format_row(row))
        elif event is Event.EVAL_END:
            self._print(f"{info['split']:5s} " + format_row({"step": trainer.step, **info["metrics"]}))
        elif event is Event.CHECKPOINT:
            self._print(f"saved {info['path']}")
        elif event is Event.INFO:
            self._print(info["message"])


class JsonlLogger(Callback):
    """Appends one JSON object per training log row and per evaluation (``"split": "valid"``).

    On resume, rows newer than the resumed step (from the interrupted run) are dropped.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = None

    def _open(self, resumed_step: int | None) -> None:
        if resumed_step is not None and self.path.is_file():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resumed_step:
                        kept.append(line)
                except ValueError:
                    continue
            self.path.write_text("".join(k + "\n" for k in kept))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self._open(None)
        assert self._file is not None
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START:
            self._open(trainer.step if info.get("resumed") else None)
        elif event is Event.LOG:
            self.write({"split": "train", **info["row"]})
        elif event is Event.EVAL_END:
            self.write({"split": info["split"], "step": trainer.step, "epoch": trainer.epoch,
                        **info["metrics"]})
        elif event is Event.FIT_END and self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardLogger(Callback):
    """Scalars to TensorBoard when ``torch.utils.tensorboard`` imports; otherwise does nothing."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        self.available = True

    def _get(self) -> Any:
        if self._writer is None and self.available:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except Exception:  # noqa: BLE001 - tensorboard is optional
                self.available = False
                return None
            self._writer = SummaryWriter(str(self.log_dir))
        return self._writer

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.LOG:
            rows, prefix = info["row"], "train"
        elif event is Event.EVAL_END:
            rows, prefix = info["metrics"], info["split"]
        elif event is Event.FIT_END and self._writer is not None:
            self._writer.close()
            self._writer = None
            return
        else:
            return
        writer = self._get()
        if writer is None:
            return
        for key, value in rows.items():
            if isinstance(value, (int, float)) and key not in ("step", "epoch") and math.isfinite(value):
                writer.add_scalar(f"{prefix}/{key}", value, trainer.step)


class ProgressBar(Callback):
    """A progress bar with ETA on a TTY (tqdm when installed, else a plain ``\\r`` line).

    The total is ``max_steps``, else ``max_epochs`` x steps per epoch when the reader's
    length is known; the ETA comes from the step rate of this ``fit()``.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._last = 0.0
        self._status = ""
        self._bar: Any = None
        self._start = (0.0, 0)

    @staticmethod
    def total_steps(trainer: "Trainer") -> int | None:
        if trainer.max_steps:
            return int(trainer.max_steps)
        epochs, per_epoch = trainer.hp.max_epochs, getattr(trainer, "steps_per_epoch", None)
        return int(epochs * per_epoch) if epochs and per_epoch else None

    def _open(self, trainer: "Trainer") -> None:
        self._start = (time.monotonic(), trainer.step)
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=self.total_steps(trainer), initial=trainer.step, file=self.stream,
                         unit="step", dynamic_ncols=True, leave=False, mininterval=0.2)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if not self.stream.isatty():
            return
        if event is Event.FIT_START:
            self._open(trainer)
        elif event is Event.LOG:
            self._status = f"loss {info['row'].get('loss', float('nan')):.3f}"
            if self._bar is not None:
                self._bar.set_postfix_str(self._status, refresh=False)
        elif event in (Event.FIT_END, Event.INTERRUPT):
            self._close()
        elif event is Event.STEP_END:
            if self._bar is not None:
                self._bar.update(trainer.step - self._bar.n)
            else:
                self._plain(trainer)

    def _plain(self, trainer: "Trainer") -> None:
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        total = self.total_steps(trainer)
        if total:
            done = min(trainer.step / total, 1.0)
            t0, s0 = self._start
            rate = (trainer.step - s0) / max(now - t0, 1e-9)
            eta = f" eta {max(total - trainer.step, 0) / rate:.0f}s" if rate > 0 else ""
            text = f"[{'#' * int(done * 30):30s}] step {trainer.step}/{total}{eta} {self._status}"
        else:
            text = f"step {trainer.step} epoch {trainer.epoch} {self._status}"
        self.stream.write("\r\033[K" + text)
        self.stream.flush()


class CsvLogger(Callback):
    """One CSV file per split under ``directory`` (``train.csv``, ``valid.csv``, ...).

    The header is the keys of the first row; a row with new keys rewrites the file
    with the wider header. On resume, rows newer than the resumed step are dropped.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _read(self, path: Path) -> tuple[list[str], list[dict[str, str]]]:
        if not path.is_file():
            return [], []
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            return list(reader.fieldnames or []), list(reader)

    def _rewrite(self, path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    def write(self, split: str, row: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{split}.csv"
        clean = {k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        columns, rows = self._read(path)
        if not path.is_file() or any(k not in columns for k in clean):
            self._rewrite(path, columns + [k for k in clean if k not in columns], rows)
            columns = columns + [k for k in clean if k not in columns]
        with open(path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, fieldnames=columns).writerow(clean)

    def _truncate(self, step: int) -> None:
        for path in self.directory.glob("*.csv"):
            columns, rows = self._read(path)
            kept = [r for r in rows if not r.get("step") or float(r["step"]) <= step]
            self._rewrite(path, columns, kept)

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if event is Event.FIT_START and info.get("resumed") and self.directory.is_dir():
            self._truncate(trainer.step)
        elif event is Event.LOG:
            self.write("train", info["row"])
        elif event is Event.EVAL_END:
            self.write(info["split"], {"step": trainer.step, "epoch": trainer.epoch, **info["metrics"]})


def default_loggers(output_dir: str | Path | None, *, console: bool = True) -> list[Callback]:
    """Console + progress bar, and ``metrics.jsonl`` + TensorBoard under ``output_dir``."""
    out: list[Callback] = []
    if console:
        out += [ConsoleLogger(), ProgressBar()]
    if output_dir is not None:
        out += [JsonlLogger(Path(output_dir) / "metrics.jsonl"),
                TensorBoardLogger(Path(output_dir) / "tb")]
    return out
