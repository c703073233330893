"""What a run of the session models did, as typed records: per model (`ModelOutcome`) and for the
run (`SessionRunOutcome`, with its `core.run_limits.caught_up` verdict). The asset turns them into
materialization metadata; the CLI reads them directly.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sessionize_assets.core.clock import iso_or_none
from sessionize_assets.core.run_limits import CatchUp, LastRun, RunLimits
from sessionize_assets.resources.tables import SESSIONS
from sessionize_assets.sessions.state import ModelState


class ModelStatus(StrEnum):
    """How one model's part of a run ended (the CLI prints it)."""

    RAN = "ran"
    SKIPPED = "skipped"
    NO_DATA = "no data"
    FAILED = "failed"
    REBUILT = "rebuilt"


@dataclass
class ModelOutcome:
    """What one model did in one run (its materialization metadata)."""

    model: str
    ran: bool = False
    skipped_reason: str | None = None
    no_data: bool = False
    failed: str | None = None
    full_rebuild_reason: str | None = None
    rows_read: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    touched: int = 0
    excluded: dict[str, int] = field(default_factory=dict)
    last_success_before: dt.datetime | None = None
    last_success_after: dt.datetime | None = None
    consumed_version_before: int | None = None
    consumed_version_after: int | None = None
    seconds: float = 0.0
    # Where the rows written were computed: "driver" or "spark" (None: not run). The sessions
    # model: their replacement and numbering; a user model: its rows.
    computed_by: str | None = None

    @property
    def total_rows_read(self) -> int:
        return sum(self.rows_read.values())

    @property
    def total_rows_written(self) -> int:
        return sum(self.rows_written.values())

    @property
    def status(self) -> ModelStatus:
        if self.failed:
            return ModelStatus.FAILED
        if self.skipped_reason:
            return ModelStatus.SKIPPED
        if self.no_data:
            return ModelStatus.NO_DATA
        if self.full_rebuild_reason:
            return ModelStatus.REBUILT
        return ModelStatus.RAN

    @property
    def detail(self) -> str | None:
        """The reason that goes with the status (failure, skip, rebuild)."""
        return {
            ModelStatus.FAILED: self.failed,
            ModelStatus.SKIPPED: self.skipped_reason,
            ModelStatus.REBUILT: self.full_rebuild_reason,
        }.get(self.status)

    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {
            "ran": self.ran,
            "rows read": self.total_rows_read,
            "rows written": self.total_rows_written,
            ("sessions touched" if self.model == SESSIONS else "users touched"): self.touched,
            "last_success": iso_or_none(self.last_success_after),
            "last_success before": iso_or_none(self.last_success_before),
            "consumed filtered_events version": self.consumed_version_after,
            "seconds": round(self.seconds, 3),
        }
        if self.skipped_reason:
            md["skipped"] = self.skipped_reason
        if self.no_data:
            md["no data"] = True
        if self.failed:
            md["failed"] = self.failed
        if self.full_rebuild_reason:
            md["full rebuild"] = self.full_rebuild_reason
        if self.computed_by:
            md["rows computed by"] = self.computed_by
        for name, value in self.rows_read.items():
            md[f"rows read: {name}"] = value
        for name, value in self.rows_written.items():
            md[f"rows written: {name}"] = value
        for name, value in self.excluded.items():
            md[name if name.startswith("new rows left out: ") else f"events left out: {name}"] = (
                value
            )
        return md


@dataclass
class SessionRunOutcome:
    """What one run of the session models did."""

    limits: RunLimits
    snapshot_version: int | None
    models: dict[str, ModelOutcome]
    warnings: list[str] = field(default_factory=list)
    manifest: dict[str, ModelState] = field(default_factory=dict)
    manifest_changed: bool = False  # the run rewrote incremental_manifest
    next_limits: RunLimits | None = None  # the window the manifest now gives the next run
    catch_up: CatchUp | None = None  # are the models caught up after this run?

    @property
    def failed(self) -> list[str]:
        return [m for m, o in self.models.items() if o.failed]

    @property
    def moved(self) -> bool:
        """True when some model's last_success or consumed version moved."""
        return any(
            o.last_success_after != o.last_success_before
            or o.consumed_version_after != o.consumed_version_before
            for o in self.models.values()
        )

    def last_run(self) -> LastRun:
        """The facts `core.run_limits.caught_up` decides from."""
        return LastRun(
            limits=self.limits,
            every_model_in_window=all(
                o.status in (ModelStatus.RAN, ModelStatus.REBUILT, ModelStatus.NO_DATA)
                for o in self.models.values()
            ),
            manifest_changed=self.manifest_changed,
            next_limits=self.next_limits,
        )

    def run_metadata(self) -> dict[str, Any]:
        md = {k: v for k, v in self.limits.as_metadata().items()}
        md["filtered_events version"] = self.snapshot_version
        if self.warnings:
            md["warnings"] = "\n".join(self.warnings)
        return md


class SessionModelError(RuntimeError):
    """A session model failed; the others' progress was recorded."""

    def __init__(self, model: str, reason: str, outcome: SessionRunOutcome) -> None:
        super().__init__(f"Session model {model} failed: {reason}")
        self.outcome = outcome
