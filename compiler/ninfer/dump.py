"""`--dump DIR`: each stage's output, written as soon as the stage has produced it, so a
failure later (a launch that does not fit, a build error) leaves everything before it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Dump:
    directory: Path | None  # None: dump nothing

    def json(self, name: str, data: Any) -> None:
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / name).write_text(json.dumps(data, indent=2, default=str))

    def tree(self, name: str, source: Path) -> None:
        """A copy of the directory `source` (object files left out)."""
        if self.directory is not None:
            shutil.copytree(source, self.directory / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.o"))
