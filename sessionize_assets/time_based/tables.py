"""The time-based branch's tables: where they are and the schemas of its bookkeeping tables.

- `filtered_events`: partitioned by `load_date` and `event_date`, so reading one load day or one
  event day prunes to that day's files, and rows per (load day, event day) are in the Delta log.
- `filtered_events_accounting`: one row per load day: the events fingerprint consumed, rows read,
  kept and dropped per rule, the greatest load time, the materialization id.
- `days_to_process`: partitioned by `load_date`; one row per (load day, event day) decided.
- `daily_aggregates`: partitioned by `event_date`; `_horizon_load_date` and `_aggregated_at` say
  what each row counts.
- `daily_aggregate_horizons`: one row per event day: horizon, rows aggregated, the latest decision
  it saw, when, and whether it was a keyhole repair (all rows loaded so far).
- `daily_aggregation_manifest`: per event day, rewritten from the state above.
- `attributes`: replaced whole, only the users whose rows can differ aggregated again; the commit
  records the daily_aggregates version, as_of and the definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from sessionize_assets.core import filtering
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.resources import tables as names


@dataclass(frozen=True)
class TimeBasedTables:
    """Where the branch's Delta tables are."""

    events: str
    filtered_events: str
    accounting: str
    days_to_process: str
    daily_aggregates: str
    horizons: str
    manifest: str
    attributes: str
    definitions: str

    @classmethod
    def at(cls, table: Callable[[str], str]) -> TimeBasedTables:
        """From a `name -> location` function (e.g. `LakeResource.table` or `Home.table`)."""
        return cls(
            events=table(names.EVENTS),
            filtered_events=table(names.FILTERED_EVENTS),
            accounting=table(names.FILTERED_EVENTS_ACCOUNTING),
            days_to_process=table(names.DAYS_TO_PROCESS),
            daily_aggregates=table(names.DAILY_AGGREGATES),
            horizons=table(names.DAILY_AGGREGATE_HORIZONS),
            manifest=table(names.DAILY_AGGREGATION_MANIFEST),
            attributes=table(names.ATTRIBUTES),
            definitions=table(names.TIME_BASED_DEFINITIONS),
        )


DROP_COLUMNS = tuple(f"dropped_{r.replace(' ', '_')}" for r in filtering.DROP_REASONS)


ACCOUNTING_SCHEMA = pa.schema(
    [
        (LOAD_DATE, pa.date32()),
        ("events_fingerprint", pa.string()),
        ("rows_read", pa.int64()),
        ("rows_kept", pa.int64()),
        *[(c, pa.int64()) for c in DROP_COLUMNS],
        ("max_load_tstamp", pa.timestamp("us", tz="UTC")),
        ("materialization_id", pa.string()),
        ("materialized_at", pa.timestamp("us", tz="UTC")),
    ]
)


DECISIONS_SCHEMA = pa.schema(
    [
        (LOAD_DATE, pa.date32()),
        (EVENT_DATE, pa.date32()),
        ("rows", pa.int64()),
        ("is_late", pa.bool_()),
        ("horizon_before", pa.date32()),
        ("pending", pa.int64()),
        ("decision", pa.string()),
        ("reason", pa.string()),
        ("decided_at", pa.timestamp("us", tz="UTC")),
        ("filtered_materialization_id", pa.string()),
        ("max_load_tstamp", pa.timestamp("us", tz="UTC")),
    ]
)


HORIZONS_SCHEMA = pa.schema(
    [
        (EVENT_DATE, pa.date32()),
        ("horizon_load_date", pa.date32()),
        ("rows_aggregated", pa.int64()),
        ("decided_through", pa.timestamp("us", tz="UTC")),
        ("aggregated_at", pa.timestamp("us", tz="UTC")),
        ("all_loaded_rows", pa.bool_()),
    ]
)


MANIFEST_SCHEMA = pa.schema(
    [
        (EVENT_DATE, pa.date32()),
        ("rows_loaded", pa.int64()),
        ("rows_aggregated", pa.int64()),
        ("pending", pa.int64()),
        ("rows_skipped_so_far", pa.int64()),
        ("horizon", pa.date32()),
        ("decided_horizon", pa.date32()),
        ("last_processed_at", pa.timestamp("us", tz="UTC")),
        ("awaiting_aggregation", pa.bool_()),
        ("accounted", pa.bool_()),
    ]
)
