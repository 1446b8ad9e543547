"""Problems whose data datagen writes once into verified shards under ``data_dir``."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

from ..data.shards import manifest_matches, read_manifest
from .base import Problem

__all__ = ["PreparedProblem"]

log = logging.getLogger(__name__)


class PreparedProblem(Problem):
    """``prepare()`` is idempotent: it regenerates only when the manifest in ``data_dir``
    does not match this problem's name and ``config``; readers call ``_ensure_prepared()``.

    Subclasses implement ``_generate()``: fetch/verify the raw files under ``raw_dir`` and
    write every file through a ``ShardWriter(self.data_dir, self.name, self.config)``.
    """

    config: ClassVar[dict[str, Any]] = {}

    def _generate(self) -> None:
        raise NotImplementedError

    def prepare(self) -> Path:
        """Datagen (idempotent): a matching manifest means the data is ready."""
        assert self.data_dir is not None and self.raw_dir is not None
        # data prepared before problems knew their registered name carries the class name
        if any(manifest_matches(self.data_dir, name, self.config) for name in (self.name, type(self).__name__)):
            log.info("%s: %s is already prepared", self.name, self.data_dir)
            return self.data_dir
        self._generate()
        log.info("%s: prepared %s", self.name, self.data_dir)
        return self.data_dir

    def _ensure_prepared(self) -> dict[str, Any]:
        """The manifest, running datagen first when there is none."""
        assert self.data_dir is not None
        if not (self.data_dir / "manifest.json").is_file():
            self.prepare()
        return read_manifest(self.data_dir)
