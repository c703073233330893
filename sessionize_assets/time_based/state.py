"""The time-based branch's state, read from the Delta log and its small tables with delta-rs (no
Spark, so sensors, planners and `status` can call it): what filtered_events consumed, what
days_to_process decided, what daily_aggregates counted, what attributes was computed from.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionize_assets.core.clock import as_date, as_utc_or_none
from sessionize_assets.core.late_days import (
    AggregationRecord,
    DecisionRecord,
    ManifestRow,
    manifest_rows,
    outstanding_event_days,
)
from sessionize_assets.core.load_windows import (
    LoadWindow,
    last_processed_load_times,
    load_window,
    stale_decision_days,
)
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.ingest.load_days import changed_load_days, events_fingerprints
from sessionize_assets.resources.delta import add_actions, delta_table, read_small_table
from sessionize_assets.settings import Settings
from sessionize_assets.time_based.tables import TimeBasedTables


@dataclass(frozen=True)
class AccountingRecord:
    """What the last materialization of filtered_events(L) read, kept and dropped."""

    load_date: dt.date
    events_fingerprint: str
    rows_read: int
    rows_kept: int
    dropped: Mapping[str, int]
    max_load_tstamp: dt.datetime | None
    materialization_id: str
    materialized_at: dt.datetime


@dataclass(frozen=True)
class TimeBasedState:
    """The branch's state, read from the Delta log and small tables with delta-rs (no Spark)."""

    events_version: int | None
    events_fingerprints: Mapping[dt.date, str]
    filtered_version: int | None
    counts: Mapping[tuple[dt.date, dt.date], int]
    accounting: Mapping[dt.date, AccountingRecord]
    decisions: Sequence[DecisionRecord]
    decided_from: Mapping[dt.date, frozenset[str]]
    aggregated: Mapping[dt.date, AggregationRecord]
    daily_aggregates_version: int | None
    attributes_source: Mapping[str, Any] = field(default_factory=dict)

    def pending_filtered(self) -> list[dt.date]:
        """Load days whose events files differ from what filtered_events last consumed (new,
        grown, emptied, or reached by a change to an earlier load day's duplicates)."""
        consumed = {d: a.events_fingerprint for d, a in self.accounting.items()}
        return changed_load_days(dict(self.events_fingerprints), consumed)

    def pending_decisions(self) -> list[dt.date]:
        """Load days whose days_to_process did not see their latest filtered_events."""
        consumed = {d: (a.materialization_id, a.rows_kept) for d, a in self.accounting.items()}
        return stale_decision_days(consumed, self.decided_from)

    def pending_load_days(self, since: dt.date | None = None) -> list[dt.date]:
        """Load days pending for either load-day asset (from `since`, e.g. start_date, on)."""
        days = set(self.pending_filtered()) | set(self.pending_decisions())
        return sorted(d for d in days if since is None or d >= since)

    def last_success(self) -> dict[str, dt.datetime | None]:
        """Per load-day model, the greatest load time it has processed (up-to-date days only)."""
        stale_filtered = set(self.pending_filtered())
        stale_decisions = stale_filtered | set(self.pending_decisions())
        return last_processed_load_times(
            {
                "filtered_events": [
                    a.max_load_tstamp for d, a in self.accounting.items() if d not in stale_filtered
                ],
                "days_to_process": [
                    a.max_load_tstamp
                    for d, a in self.accounting.items()
                    if d not in stale_decisions
                ],
            }
        )

    def load_window(self, settings: Settings, now: dt.datetime) -> LoadWindow:
        """The load-time window the next run takes on (core.load_windows.load_window)."""
        return load_window(
            settings.start_date, settings.backfill_limit_days, now, self.last_success()
        )

    def outstanding(self) -> dict[dt.date, dt.datetime]:
        """Event days decided "process" after daily_aggregates(D) last ran."""
        return outstanding_event_days(self.decisions, self.aggregated)

    def manifest(self) -> list[ManifestRow]:
        return manifest_rows(self.counts, self.decisions, self.aggregated)

    def attributes_stale(self, as_of: dt.date) -> bool:
        """attributes was computed from another daily_aggregates version or for another day."""
        if self.daily_aggregates_version is None:
            return False
        return (
            self.attributes_source.get("daily_aggregates_version") != self.daily_aggregates_version
            or self.attributes_source.get("as_of") != as_of.isoformat()
        )


def partition_counts(
    path: str, version: int | None = None
) -> tuple[int | None, dict[tuple[dt.date, dt.date], int]]:
    """Rows of filtered_events per (load day, event day), from the file statistics in the Delta
    log (no data read): the table is partitioned by both days."""
    version, actions = add_actions(
        path, version, columns=["num_records", f"partition.{LOAD_DATE}", f"partition.{EVENT_DATE}"]
    )
    counts: dict[tuple[dt.date, dt.date], int] = defaultdict(int)
    for action in actions:
        if action.get("num_records") is None:
            raise RuntimeError(f"{path}: a data file has no row count in the Delta log")
        key = (
            as_date(action[f"partition.{LOAD_DATE}"]),
            as_date(action[f"partition.{EVENT_DATE}"]),
        )
        counts[key] += action["num_records"]
    return version, dict(counts)


def files_in(
    path: str, column: str, days: Iterable[dt.date], version: int | None = None
) -> tuple[int, int]:
    """(files of the partitions `column` in `days`, all files of the table)."""
    wanted = set(days)
    _, actions = add_actions(path, version, columns=[f"partition.{column}"])
    hits = sum(1 for a in actions if as_date(a[f"partition.{column}"]) in wanted)
    return hits, len(actions)


def rows_in(
    path: str, column: str, days: Iterable[dt.date], version: int | None = None
) -> int | None:
    """Rows of the partitions `column` in `days`, from the Delta log's file statistics (None when
    a file has no row count)."""
    wanted = set(days)
    _, actions = add_actions(path, version, columns=["num_records", f"partition.{column}"])
    hits = [a["num_records"] for a in actions if as_date(a[f"partition.{column}"]) in wanted]
    return None if any(n is None for n in hits) else sum(hits)


def read_accounting(path: str) -> dict[dt.date, AccountingRecord]:
    out = {}
    for r in read_small_table(path):
        out[as_date(r[LOAD_DATE])] = AccountingRecord(
            load_date=as_date(r[LOAD_DATE]),
            events_fingerprint=r["events_fingerprint"],
            rows_read=r["rows_read"],
            rows_kept=r["rows_kept"],
            dropped={k[len("dropped_") :]: v for k, v in r.items() if k.startswith("dropped_")},
            max_load_tstamp=as_utc_or_none(r["max_load_tstamp"]),
            materialization_id=r["materialization_id"],
            materialized_at=as_utc_or_none(r["materialized_at"]),
        )
    return out


def read_decisions(
    path: str,
) -> tuple[list[DecisionRecord], dict[dt.date, frozenset[str]], list[dict]]:
    """(decision records, {load day: filtered_events materialization ids}, raw rows)."""
    rows = read_small_table(path)
    records = [
        DecisionRecord(
            load_date=as_date(r[LOAD_DATE]),
            event_date=as_date(r[EVENT_DATE]),
            decision=r["decision"],
            decided_at=as_utc_or_none(r["decided_at"]),
            rows=r["rows"],
        )
        for r in rows
    ]
    sources: dict[dt.date, set[str]] = defaultdict(set)
    for r in rows:
        sources[as_date(r[LOAD_DATE])].add(r["filtered_materialization_id"])
    return records, {d: frozenset(s) for d, s in sources.items()}, rows


def read_aggregation_records(path: str) -> dict[dt.date, AggregationRecord]:
    out = {}
    for r in read_small_table(path):
        out[as_date(r[EVENT_DATE])] = AggregationRecord(
            event_date=as_date(r[EVENT_DATE]),
            horizon=as_date(r["horizon_load_date"]) if r["horizon_load_date"] is not None else None,
            rows_aggregated=r["rows_aggregated"],
            decided_through=as_utc_or_none(r["decided_through"]),
            aggregated_at=as_utc_or_none(r["aggregated_at"]),
        )
    return out


def attributes_source(path: str) -> dict[str, Any]:
    """What the last write of `attributes` recorded in its commit (daily_aggregates version, as_of,
    definitions)."""
    recorded = recorded_source(delta_table(path))
    return recorded if recorded is not None else {}


def recorded_source(table: Any) -> dict[str, Any] | None:
    """What the commit of the delta-rs `table`'s loaded version recorded (its `userMetadata`);
    None when the table is absent, its last commit is not that version (a later one landed
    after the load) or the metadata is not JSON."""
    if table is None:
        return None
    history = table.history(1)
    if not history:
        return {}
    if history[0].get("version") != table.version():
        return None
    try:
        return json.loads(history[0].get("userMetadata") or "{}")
    except json.JSONDecodeError:
        return None


def read_state(tables: TimeBasedTables) -> TimeBasedState:
    """The branch's state from the lake (delta-rs only: safe in sensors)."""
    events_version, fingerprints = events_fingerprints(tables.events)
    filtered_version, counts = partition_counts(tables.filtered_events)
    decisions, decided_from, _ = read_decisions(tables.days_to_process)
    aggregates = delta_table(tables.daily_aggregates)
    return TimeBasedState(
        events_version=events_version,
        events_fingerprints=fingerprints,
        filtered_version=filtered_version,
        counts=counts,
        accounting=read_accounting(tables.accounting),
        decisions=decisions,
        decided_from=decided_from,
        aggregated=read_aggregation_records(tables.horizons),
        daily_aggregates_version=aggregates.version() if aggregates is not None else None,
        attributes_source=attributes_source(tables.attributes),
    )
