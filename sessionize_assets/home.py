"""The home folder: where the warehouse, the landing folder and the Dagster instance live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    """Folders under `--home` (default `$SESSIONIZE_HOME`, else `./.sessionize`).

    `warehouse` may be overridden by `$SESSIONIZE_WAREHOUSE` (e.g. an object-store URI on a cluster).
    """

    root: Path

    @classmethod
    def from_env(cls) -> Home:
        return cls(Path(os.environ.get("SESSIONIZE_HOME") or ".sessionize").resolve())

    @property
    def warehouse(self) -> str:
        return os.environ.get("SESSIONIZE_WAREHOUSE") or str(self.root / "warehouse")

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    def table(self, name: str) -> str:
        """The location of a Delta table."""
        return f"{self.warehouse.rstrip('/')}/{name}"

    def ensure(self) -> None:
        for folder in (self.root, self.landing, self.dagster_home):
            folder.mkdir(parents=True, exist_ok=True)
        if "://" not in self.warehouse:
            Path(self.warehouse).mkdir(parents=True, exist_ok=True)
