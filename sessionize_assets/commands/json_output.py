"""`--json` documents of `status`, `verify`, `manifest list|show` and `load` (docs/json.md).

Each function turns the data a command's human output is printed from into plain JSON values;
the CLI adds the envelope (`document`). Schema version 1: within a version fields are only
added; renaming or removing one bumps `SCHEMA_VERSION`. Dates and times are ISO 8601 text
(instants in UTC), durations are seconds.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sessionize_assets.core.clock import as_utc
from sessionize_assets.core.manifest_state import ItemState, ItemStatus

if TYPE_CHECKING:
    from sessionize_assets.commands.loading import FolderLoadReport
    from sessionize_assets.ingest.loader import LoadReport
    from sessionize_assets.pipeline import BranchStatusData, StatusData, VerifyResult

SCHEMA_VERSION = 1

# The `kind` of an error document, by exit status (core/outcomes.py).
ERROR_KINDS = {
    2: "user_error",  # a setting, a path, an argument
    3: "blocked",  # an item held by another live run, fail-locked, or the home's command lock
    4: "failed",  # Spark, the JVM, Delta or Dagster
    130: "interrupted",
}


def document(
    schema: str,
    exit_status: int,
    content: Mapping[str, Any] | None = None,
    error: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The envelope: `schema`, `version`, `exit_status`, `error` (null, or kind and message),
    then the command's content (absent in an error document)."""
    doc: dict[str, Any] = {
        "schema": f"sessionize/{schema}",
        "version": SCHEMA_VERSION,
        "exit_status": int(exit_status),
        "error": None if error is None else {"kind": error[0], "message": error[1]},
    }
    doc.update(content or {})
    return doc


def dumps(doc: Mapping[str, Any]) -> str:
    """One line of JSON (non-ASCII kept as is)."""
    return json.dumps(doc, ensure_ascii=False, allow_nan=False)


# ------------------------------------------------------------------------------------ values


def _iso(value: dt.date | dt.datetime | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return as_utc(value).isoformat()
    return value.isoformat()


def _days(days: Iterable[dt.date]) -> list[str]:
    return [d.isoformat() for d in days]


def _seconds(age: dt.timedelta | None) -> int | None:
    return None if age is None else max(0, int(age.total_seconds()))


def _snake(name: str) -> str:
    return name.lower().replace(" ", "_").replace("-", "_")


# ---------------------------------------------------------------------------- manifest items


def item(state: ItemState) -> dict[str, Any]:
    """An item of the processing manifest with its derived state (a row of `manifest list`)."""
    from sessionize_assets.commands.manifest import ItemRow

    row = ItemRow.of(state)
    return {
        "item_id": row.item_id,
        "state": row.status,
        "holder_run_id": row.holder_run_id,
        "application": row.application,
        "lock_age_seconds": _seconds(state.lock_age),
        "last_record_at": _iso(row.last_record_at),
        "record_count": row.records,
        "reason": row.reason,
    }


def manifest_list(
    states: Iterable[ItemState], state: ItemStatus | None, item_prefix: str | None
) -> dict[str, Any]:
    return {
        "filter": {"state": state.value if state else None, "item_prefix": item_prefix},
        "items": [item(s) for s in states],
    }


def manifest_show(state: ItemState) -> dict[str, Any]:
    return {
        "item": {**item(state), "description": state.describe()},
        "records": [
            {
                "time": _iso(r.time),
                "state": r.state.value,
                "application": r.application,
                "run_id": r.run_id,
                "record_id": r.record_id,
                "previous_record_id": r.previous_record_id,
                "payload": r.payload,
            }
            for r in state.records
        ],
    }


# ------------------------------------------------------------------------------------ status

_TIME_BASED_KEYS = (
    "run_limits",
    "next_run",
    "pending_filtered_load_days",
    "pending_decision_load_days",
    "event_days_awaiting_aggregation",
    "pending_event_days",
    "pending_rows",
    "skipped",
    "unaccounted_event_days",
    "attributes_stale",
)
_SESSION_BASED_KEYS = ("run_limits", "models", "filtered_events_version", "quarantined_sessions")


def _branch(data: BranchStatusData, keys: tuple[str, ...], body: Any) -> dict[str, Any]:
    failure = data.failure
    out: dict[str, Any] = {
        "failure": None
        if failure is None
        else {
            "runs": failure.runs,
            "since": _iso(failure.since),
            "latest_run_id": failure.latest_run_id,
            "error": failure.error,
        },
        "unreadable": data.unreadable,
    }
    out.update(dict.fromkeys(keys) if data.report is None else body(data.report))
    return out


def _time_based(report: Any) -> dict[str, Any]:
    limits = report.plan.window
    pending = [r for r in report.manifest if r.pending]
    skipped = [r for r in report.manifest if r.rows_skipped_so_far]
    return {
        "run_limits": {
            "state": _snake(limits.state.name),
            "message": limits.state.sentence,
            "window": {
                "start": _iso(limits.start),
                "end": _iso(limits.end),
                "end_inclusive": False,
            },
        },
        "next_run": {
            "load_days": _days(report.plan.load_days),
            "earlier_load_days": _days(report.plan.earlier),
            "deferred_load_days": _days(report.plan.deferred),
        },
        "pending_filtered_load_days": _days(report.pending_filtered),
        "pending_decision_load_days": _days(report.pending_decisions),
        "event_days_awaiting_aggregation": _days(report.outstanding),
        "pending_event_days": [
            {
                "event_date": _iso(r.event_date),
                "pending_rows": r.pending,
                "rows_aggregated": r.rows_aggregated,
                "horizon": _iso(r.horizon),
                "rows_skipped_so_far": r.rows_skipped_so_far,
            }
            for r in pending
        ],
        "pending_rows": sum(r.pending for r in pending),
        "skipped": {
            "event_days": len(skipped),
            "rows": sum(r.rows_skipped_so_far for r in skipped),
        },
        "unaccounted_event_days": [_iso(r.event_date) for r in report.manifest if not r.accounted],
        "attributes_stale": bool(report.attributes_stale),
    }


def _session_based(report: Any) -> dict[str, Any]:
    limits = report.limits
    pending = report.pending_versions
    models = []
    for model in report.enabled_models:
        s = report.manifest.get(model)
        models.append(
            {
                "model": model,
                "in_manifest": s is not None,
                "last_success": _iso(s.last_success) if s else None,
                "consumed_version": s.consumed_version if s else None,
                "processed_through": _iso(s.processed_through) if s else None,
                "pending_versions": pending.get(model, 0),
            }
        )
    return {
        "run_limits": {
            "state": _snake(limits.state.name),
            "message": limits.state_message,
            "window": {
                "start": _iso(limits.lower_limit),
                "end": _iso(limits.upper_limit),
                "end_inclusive": True,
            },
            "window_reaches_now": limits.reaches(report.now),
        },
        "models": models,
        "filtered_events_version": report.filtered_events_version,
        "quarantined_sessions": report.quarantined_sessions,
    }


def status(data: StatusData) -> dict[str, Any]:
    from sessionize_assets.commands.manifest import needs_attention

    states = list(data.manifest.values())
    return {
        "time_based": _branch(data.time_based, _TIME_BASED_KEYS, _time_based),
        "session_based": _branch(data.sessions, _SESSION_BASED_KEYS, _session_based),
        "processing_manifest": {
            "items": len(states),
            "by_state": {s.value: sum(x.status is s for x in states) for s in ItemStatus},
            "attention": [item(s) for s in needs_attention(states)],
        },
        "cursor_checkpoints": [
            {
                "name": name,
                "done_before": _iso(state.global_cursor),
                "partitions": {k: _iso(v) for k, v in sorted(state.partitions.items())},
                "run_id": row["run_id"],
                "checkpoint_time": _iso(row["checkpoint_time"]),
            }
            for name, (state, row) in data.cursors.items()
        ],
    }


def lateness(counts: Mapping[tuple[dt.date, dt.date], int], last_load_days: int) -> dict:
    """`status --lateness`: the last load days' rows, late share, percentiles and rows by days
    late (what `core.lateness.lateness_lines` prints)."""
    from sessionize_assets.core.lateness import lateness_by_load_day

    summary = lateness_by_load_day(counts)[-last_load_days:] if last_load_days else []
    out = []
    for s in summary:
        by_late: dict[int, int] = {}
        for (load_day, event_day), rows in counts.items():
            if load_day == s.load_day and rows:
                late = (load_day - event_day).days
                by_late[late] = by_late.get(late, 0) + rows
        out.append(
            {
                "load_day": _iso(s.load_day),
                "rows": s.rows,
                "late_rows": s.late_rows,
                "late_share": round(s.late_share, 6),
                "p50_days": s.p50_days,
                "p95_days": s.p95_days,
                "max_days": s.max_days,
                "rows_by_days_late": {str(k): by_late[k] for k in sorted(by_late)},
            }
        )
    return {"load_days": out}


# ------------------------------------------------------------------------------------ verify


def _session_checks(report: Any) -> list[tuple[str, str, list[Any]]]:
    """(table, check, differences) of the session branch: the models' consumed versions
    against filtered_events (`consistency`), each table against a recompute (`recompute`), and
    the quarantine listing against the quarantined sessions (`listing`)."""
    from sessionize_assets.resources.tables import INCREMENTAL_MANIFEST, QUARANTINED_SESSIONS

    consistency = [d for d in report.differences if d.kind in ("pending", "inconsistent")]
    rest = [d for d in report.differences if d not in consistency]
    checks = [(INCREMENTAL_MANIFEST, "consistency", consistency)]
    for table in report.compared:
        checks.append((table, "recompute", [d for d in rest if d.table == table]))
    if report.compared:  # the recompute ran: so did the listing check
        listing = [d for d in rest if d.table == QUARANTINED_SESSIONS]
        checks.append((QUARANTINED_SESSIONS, "listing", listing))
    return checks


def verify(result: VerifyResult) -> dict[str, Any]:
    """Every check of both branches with its differences, and what is waiting (not a difference)."""
    time_based, sessions = result.time_based, result.sessions
    checks: list[dict[str, Any]] = []
    for check in time_based.checks:
        checks.append(
            {
                "branch": "time_based",
                "table": check.table,
                "check": check.name,
                "rows_compared": None,
                "differences": len(check.differences),
                "not_listed": 0,
                "details": [
                    {"table": check.table, "kind": None, "key": None, "detail": d}
                    for d in check.differences
                ],
            }
        )
    for table, name, found in _session_checks(sessions):
        recompute = name == "recompute"
        checks.append(
            {
                "branch": "session_based",
                "table": table,
                "check": name,
                "rows_compared": sessions.compared.get(table) if recompute else None,
                "differences": len(found),
                "not_listed": sessions.truncated.get(table, 0) if recompute else 0,
                "details": [
                    {"table": d.table, "kind": d.kind, "key": d.key, "detail": d.detail}
                    for d in found
                ],
            }
        )
    return {
        "ok": not result.differences,
        "differences": len(result.differences),
        "checks": checks,
        "time_based": {
            "event_days_checked": time_based.event_days_checked,
            "pending_rows": dict(sorted(time_based.pending_rows.items())),
            "pending_load_days": _days(time_based.pending_load_days),
        },
        "session_based": {
            "processed_through": _iso(sessions.processed_through),
            "waiting_rows": sessions.waiting_rows,
            "lifecycle_runs_replayed": sessions.runs_replayed,
            "lifecycle_taken_as_given": sessions.lifecycle_given,
        },
    }


# -------------------------------------------------------------------------------------- load


def load(reports: Iterable[LoadReport], folders: FolderLoadReport | None) -> dict[str, Any]:
    """Every file of the load (of every window with --by-load-date), with its counts."""
    files = [f for report in reports for f in report.files]
    loaded = [f for f in files if f.skipped_reason is None]
    return {
        "files": [
            {
                "path": f.path,
                "sha256": f.sha256,
                "load_id": f.load_id,
                "status": "skipped" if f.skipped_reason is not None else "loaded",
                "skipped_reason": f.skipped_reason,
                "rows_read": f.rows_read,
                "rows_kept": f.rows_kept,
                "rows_rejected": f.rows_invalid,
                "rows_by_load_day": {_iso(d): n for d, n in sorted(f.rows_by_load_day.items())},
                "rejected_by_reason": dict(sorted(f.invalid_by_reason.items())),
            }
            for f in files
        ],
        "totals": {
            "files": len(files),
            "files_loaded": len(loaded),
            "files_skipped": len(files) - len(loaded),
            "rows_read": sum(f.rows_read for f in loaded),
            "rows_kept": sum(f.rows_kept for f in loaded),
            "rows_rejected": sum(f.rows_invalid for f in loaded),
        },
        "load_days": _days(sorted({d for f in loaded for d in f.rows_by_load_day})),
        "by_load_date": None
        if folders is None
        else {
            "windows": [
                {
                    "source": source,
                    "start": _iso(window.start),
                    "end": _iso(window.end),
                    "load_days": list(days),
                }
                for source, window, days in folders.windows
            ],
            "checkpoints": folders.checkpoints,
            "cursor": "global" if folders.use_global_cursor else "per_source",
        },
    }
