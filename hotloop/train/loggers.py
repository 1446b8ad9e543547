"""Loggers are callbacks: console lines, ``metrics.jsonl``, TensorBoard, a TTY progress bar."""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .events import Callback, Event

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

__all__ = ["ConsoleLogger", "JsonlLogger", "TensorBoardLogger", "ProgressBar", "format_row",
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
            self._print("train " + format_row(info["row"]))
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
    """A one-line ``\\r`` progress display, only when the stream is a TTY (max 5 redraws/s)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._last = 0.0
        self._status = ""

    def on_event(self, event: Event, trainer: "Trainer", **info: Any) -> None:
        if not self.stream.isatty():
            return
        if event is Event.LOG:
            row = info["row"]
            self._status = f"loss {row.get('loss', float('nan')):.3f}"
        elif event is Event.FIT_END:
            self.stream.write("\r\033[K")
            self.stream.flush()
            return
        elif event is not Event.STEP_END:
            return
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        total = trainer.max_steps
        if total:
            done = min(trainer.step / total, 1.0)
            bar = "#" * int(done * 30)
            text = f"[{bar:30s}] step {trainer.step}/{total} {self._status}"
        else:
            text = f"step {trainer.step} epoch {trainer.epoch} {self._status}"
        self.stream.write("\r\033[K" + text)
        self.stream.flush()


def default_loggers(output_dir: str | Path | None, *, console: bool = True) -> list[Callback]:
    """Console + progress bar, and ``metrics.jsonl`` + TensorBoard under ``output_dir``."""
    out: list[Callback] = []
    if console:
        out += [ConsoleLogger(), ProgressBar()]
    if output_dir is not None:
        out += [JsonlLogger(Path(output_dir) / "metrics.jsonl"),
                TensorBoardLogger(Path(output_dir) / "tb")]
    return out
