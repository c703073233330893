"""For `sessionize status`: a branch whose last runs failed, and since when (from the Dagster
instance's run records: every run of a branch carries its lane tag)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sessionize_assets.jobs import LANE_TAG

BRANCH_LANES = {"time-based branch": "time_based", "session-based branch": "sessions"}


def _error_of(instance: Any, run_id: str) -> str | None:
    """The first line of the run's failed step's innermost error, if any."""
    from dagster import DagsterEventType

    for record in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        data = record.dagster_event.event_specific_data if record.dagster_event else None
        error = getattr(data, "error", None)
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            lines = [line for line in error.message.splitlines() if line.strip()]
            return lines[0].strip() if lines else error.cls_name
    return None


@dataclass(frozen=True)
class BranchFailure:
    """A branch whose latest finished runs failed: how many in a row, since when, the error."""

    runs: int
    since: dt.datetime
    latest_run_id: str
    error: str

    def line(self) -> str:
        return (
            f"FAILED: the last {self.runs} run(s) of this branch failed, since "
            f"{self.since.isoformat(timespec='seconds')} (latest run {self.latest_run_id[:8]}): "
            f"{self.error}"
        )


def branch_failure(instance: Any, branch: str, limit: int = 50) -> BranchFailure | None:
    """None when the branch's latest finished run succeeded (or it never ran); else the failed
    streak's length, since when, and the latest error."""
    from dagster import DagsterRunStatus, RunsFilter

    records = instance.get_run_records(
        filters=RunsFilter(tags={LANE_TAG: BRANCH_LANES[branch]}), limit=limit
    )
    finished = [
        r
        for r in records
        if r.dagster_run.status
        in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
    ]
    streak = []
    for record in finished:  # newest first
        if record.dagster_run.status is DagsterRunStatus.SUCCESS:
            break
        streak.append(record)
    if not streak:
        return None
    latest, first = streak[0], streak[-1]
    since = first.start_time or first.create_timestamp.timestamp()
    error = _error_of(instance, latest.dagster_run.run_id) or latest.dagster_run.status.value
    return BranchFailure(
        runs=len(streak),
        since=dt.datetime.fromtimestamp(since, dt.UTC),
        latest_run_id=latest.dagster_run.run_id,
        error=error,
    )


def failure_lines(instance: Any, branch: str, limit: int = 50) -> list[str]:
    """[] when the branch's latest finished run succeeded (or it never ran); else one line."""
    failure = branch_failure(instance, branch, limit)
    return [] if failure is None else [failure.line()]
