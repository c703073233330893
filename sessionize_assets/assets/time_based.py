"""The time-based branch (SPEC section 5): filtered_events -> days_to_process -> daily_aggregates ->
attributes, plus the daily_aggregation_manifest.

Assets are thin: read Delta (Spark for data, delta-rs for the small state), call the pure core
(`core.filtering`, `core.late_days`, `core.aggregates`, `core.attributes`), write Delta, return
metadata. The step functions (`filtered_events_step`, ...) do the work and are what the assets, the
commands and the tests call; `read_state` derives what is pending from the lake without Spark.

Tables (under the warehouse):

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
- `attributes`: dropped and recomputed; the commit records the daily_aggregates version and as_of.
"""

import dataclasses
import datetime as dt
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionize_assets.core import aggregates as agg
from sessionize_assets.core import attributes as attrs
from sessionize_assets.core import filtering
from sessionize_assets.core.late_days import (
    AggregationRecord,
    DecisionRecord,
    ManifestRow,
    decide_load_days,
    decided_horizons,
    event_days_to_request,
    latest_process_decisions,
    manifest_rows,
    outstanding_event_days,
    rows_up_to_horizon,
)
from sessionize_assets.core.load_windows import (
    RunLimits,
    last_processed_load_times,
    run_limits,
    stale_decision_days,
)
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.load_days import EMPTY_FINGERPRINT, changed_load_days, events_fingerprints
from sessionize_assets.partitions import daily_partitions, late_day_lineage
from sessionize_assets.resources import shared_reads
from sessionize_assets.resources import tables as names
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.manifest_lock import partition_locks
from sessionize_assets.resources.spark import SparkDeltaResource
from sessionize_assets.settings import Settings

GROUP = "time_based"
LOAD_DAY_MODELS = ("filtered_events", "days_to_process")
# Runs launched by the late-days sensor carry this tag: they are never keyhole repairs.
REQUESTED_BY_TAG = "sessionize/requested_by"


# ----------------------------------------------------------------------------------- tables


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

    @classmethod
    def at(cls, table: Callable[[str], str]) -> "TimeBasedTables":
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
        )


# ------------------------------------------------------------------ state from the lake


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

    def run_limits(self, settings: Settings, now: dt.datetime) -> RunLimits:
        return run_limits(
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


def _as_date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value))


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _delta_table(path: str, version: int | None = None):  # noqa: ANN202 - deltalake.DeltaTable
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path, version=version) if version is not None else DeltaTable(path)
    except TableNotFoundError:
        return None


def _add_actions(path: str, version: int | None = None) -> tuple[int | None, list[dict[str, Any]]]:
    """(version, add actions as dicts with `path`, `num_records`, `partition.<col>`)."""
    import pyarrow as pa

    table = _delta_table(path, version)
    if table is None:
        return None, []
    return table.version(), pa.table(table.get_add_actions(flatten=True)).to_pylist()


def partition_counts(
    path: str, version: int | None = None
) -> tuple[int | None, dict[tuple[dt.date, dt.date], int]]:
    """Rows of filtered_events per (load day, event day), from the file statistics in the Delta
    log (no data read): the table is partitioned by both days."""
    version, actions = _add_actions(path, version)
    counts: dict[tuple[dt.date, dt.date], int] = defaultdict(int)
    for action in actions:
        if action.get("num_records") is None:
            raise RuntimeError(f"{path}: a data file has no row count in the Delta log")
        key = (
            _as_date(action[f"partition.{LOAD_DATE}"]),
            _as_date(action[f"partition.{EVENT_DATE}"]),
        )
        counts[key] += action["num_records"]
    return version, dict(counts)


def files_in(
    path: str, column: str, days: Iterable[dt.date], version: int | None = None
) -> tuple[int, int]:
    """(files of the partitions `column` in `days`, all files of the table)."""
    wanted = set(days)
    _, actions = _add_actions(path, version)
    hits = sum(1 for a in actions if _as_date(a[f"partition.{column}"]) in wanted)
    return hits, len(actions)


def _read_rows(path: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    table = _delta_table(path)
    if table is None:
        return []
    return table.to_pyarrow_table(columns=list(columns) if columns else None).to_pylist()


def read_accounting(path: str) -> dict[dt.date, AccountingRecord]:
    out = {}
    for r in _read_rows(path):
        out[_as_date(r[LOAD_DATE])] = AccountingRecord(
            load_date=_as_date(r[LOAD_DATE]),
            events_fingerprint=r["events_fingerprint"],
            rows_read=r["rows_read"],
            rows_kept=r["rows_kept"],
            dropped={k[len("dropped_") :]: v for k, v in r.items() if k.startswith("dropped_")},
            max_load_tstamp=_utc(r["max_load_tstamp"]),
            materialization_id=r["materialization_id"],
            materialized_at=_utc(r["materialized_at"]),
        )
    return out


def read_decisions(
    path: str,
) -> tuple[list[DecisionRecord], dict[dt.date, frozenset[str]], list[dict]]:
    """(decision records, {load day: filtered_events materialization ids}, raw rows)."""
    rows = _read_rows(path)
    records = [
        DecisionRecord(
            load_date=_as_date(r[LOAD_DATE]),
            event_date=_as_date(r[EVENT_DATE]),
            decision=r["decision"],
            decided_at=_utc(r["decided_at"]),
            rows=r["rows"],
        )
        for r in rows
    ]
    sources: dict[dt.date, set[str]] = defaultdict(set)
    for r in rows:
        sources[_as_date(r[LOAD_DATE])].add(r["filtered_materialization_id"])
    return records, {d: frozenset(s) for d, s in sources.items()}, rows


def read_aggregation_records(path: str) -> dict[dt.date, AggregationRecord]:
    out = {}
    for r in _read_rows(path):
        out[_as_date(r[EVENT_DATE])] = AggregationRecord(
            event_date=_as_date(r[EVENT_DATE]),
            horizon=_as_date(r["horizon_load_date"])
            if r["horizon_load_date"] is not None
            else None,
            rows_aggregated=r["rows_aggregated"],
            decided_through=_utc(r["decided_through"]),
            aggregated_at=_utc(r["aggregated_at"]),
        )
    return out


def attributes_source(path: str) -> dict[str, Any]:
    """What the last write of `attributes` recorded in its commit (daily_aggregates version, as_of)."""
    table = _delta_table(path)
    if table is None:
        return {}
    history = table.history(1)
    try:
        return json.loads(history[0].get("userMetadata") or "{}") if history else {}
    except json.JSONDecodeError:
        return {}


def read_state(tables: TimeBasedTables) -> TimeBasedState:
    """The branch's state from the lake (delta-rs only: safe in sensors)."""
    events_version, fingerprints = events_fingerprints(tables.events)
    filtered_version, counts = partition_counts(tables.filtered_events)
    decisions, decided_from, _ = read_decisions(tables.days_to_process)
    aggregates = _delta_table(tables.daily_aggregates)
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


# ------------------------------------------------------------------------ Delta writes (Spark)


def _in_list(column: str, days: Iterable[dt.date]) -> str:
    values = ", ".join(f"DATE'{d.isoformat()}'" for d in sorted(set(days)))
    return f"{column} IN ({values})"


def _exists(path: str) -> bool:
    return _delta_table(path) is not None


def replace_partitions(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    column: str,
    days: Iterable[dt.date],
    partition_by: Sequence[str],
    properties: Mapping[str, str] | None = None,
) -> None:
    """Replace exactly the rows of `days` (in partition column `column`) with `df` (Spark)."""
    writer = df.write.format("delta").option("mergeSchema", "true")
    if not _exists(path):
        for key, value in (properties or {}).items():
            writer = writer.option(key, value)
        writer.mode("append").partitionBy(*partition_by).save(path)
        return
    (
        writer.mode("overwrite")
        .option("partitionOverwriteMode", "static")
        .option("replaceWhere", _in_list(column, days))
        .save(path)
    )


# The small bookkeeping tables (a row per day) are written with delta-rs: no Spark job for a
# handful of rows. Spark, delta-rs, DuckDB and Polars read them like any other Delta table.


def _committed(write: Callable[[], None], attempts: int = 8) -> None:
    """Run a delta-rs write, again when a concurrent writer won the commit."""
    from deltalake.exceptions import CommitFailedError

    for attempt in range(attempts):
        try:
            write()
            return
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


def replace_small(
    path: str,
    rows: Sequence[Mapping[str, Any]],
    schema: pa.Schema,
    column: str | None = None,
    days: Iterable[dt.date] = (),
    partition_by: Sequence[str] | None = None,
) -> None:
    """Replace the rows of `days` (or the whole table when `column` is None) with `rows`."""
    from deltalake import write_deltalake

    data = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    predicate = None
    if column is not None:
        values = ", ".join(f"'{d.isoformat()}'" for d in sorted(set(days)))
        predicate = f"{column} IN ({values})"

    def write() -> None:
        if not _exists(path):
            write_deltalake(
                path, data, mode="append", partition_by=list(partition_by) if partition_by else None
            )
        elif predicate is None:
            write_deltalake(path, data, mode="overwrite", schema_mode="overwrite")
        else:
            write_deltalake(path, data, mode="overwrite", predicate=predicate)

    _committed(write)


def upsert_small(path: str, rows: Sequence[Mapping[str, Any]], schema: pa.Schema, key: str) -> None:
    """MERGE rows by `key` into a small table (created when absent)."""
    from deltalake import DeltaTable, write_deltalake

    data = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)

    def write() -> None:
        if not _exists(path):
            write_deltalake(path, data, mode="append")
            return
        (
            DeltaTable(path)
            .merge(data, predicate=f"t.{key} = s.{key}", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    _committed(write)


# ------------------------------------------------------------------------- filtered_events

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


@dataclass
class StepResult:
    """What a step did: metadata for Dagster and facts for the commands' reports."""

    metadata: dict[str, Any] = field(default_factory=dict)
    used_spark: bool = False
    facts: dict[str, Any] = field(default_factory=dict)

    def dagster_metadata(self) -> dict[str, MetadataValue]:
        out: dict[str, MetadataValue] = {}
        for key, value in self.metadata.items():
            if isinstance(value, MetadataValue):
                out[key] = value
            elif isinstance(value, bool):
                out[key] = MetadataValue.bool(value)
            elif isinstance(value, int):
                out[key] = MetadataValue.int(value)
            elif isinstance(value, float):
                out[key] = MetadataValue.float(value)
            elif isinstance(value, dict | list):
                out[key] = MetadataValue.json(value)
            else:
                out[key] = MetadataValue.text(str(value))
        return out


def _limits_metadata(state: TimeBasedState, settings: Settings, now: dt.datetime) -> dict[str, Any]:
    limits = state.run_limits(settings, now)
    return {
        "run state": limits.state.value,
        "run window": f"[{limits.start.isoformat()}, {limits.end.isoformat()})",
    }


def filtered_events_step(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    load_days: Sequence[dt.date],
    now: dt.datetime,
) -> StepResult:
    """Filter and deduplicate load days; replace exactly their rows; record the accounting.

    Later load days (already materialized) that a change reaches through duplicates get their
    consumed fingerprint invalidated, so they show up as pending and are redone.
    """
    started = time.monotonic()
    days = sorted(set(load_days))
    state = read_state(tables)
    fingerprints = dict(state.events_fingerprints)  # read before the data: a newer load re-runs
    previous = state.accounting
    has_events = [d for d in days if d in fingerprints]
    had_rows = [d for d in days if d in previous]
    result = StepResult(metadata=_limits_metadata(state, settings, now))
    result.metadata["load days"] = ", ".join(d.isoformat() for d in days)
    if not has_events and not had_rows:
        result.metadata.update(
            {
                "rows read": 0,
                "rows written": 0,
                "note": "no data in these load days: done without a Spark job",
            }
        )
        result.metadata["time taken (s)"] = round(time.monotonic() - started, 3)
        result.facts = {"accounting": {}, "reached": []}
        return result

    n = settings.dedupe_lookback_days
    first, last = days[0] - dt.timedelta(days=n), days[-1] + dt.timedelta(days=n)
    if not _exists(tables.events):
        raise RuntimeError(f"the events table at {tables.events} does not exist")
    events = spark.read.format("delta").load(tables.events)
    # The load days and their look-back days, scanned once: marking reads the load days twice
    # (ranking copies, matching earlier ids) and the look-back days once more. Released as soon as
    # `marked` below is computed.
    window = events.filter(
        (F.col(LOAD_DATE) >= F.lit(first)) & (F.col(LOAD_DATE) <= F.lit(last))
    ).persist(StorageLevel.MEMORY_AND_DISK)
    rows = window.filter(F.col(LOAD_DATE).isin(days))
    # Marked once and kept (in memory, spilling to disk for big load days): the counts, the reach
    # check and the write then read `events` once, not once each (docs/benchmarks.md).
    marked = filtering.mark_rows(
        rows,
        window.filter(F.col(LOAD_DATE) < F.lit(days[-1])),
        n,
        app_ids=settings.app_ids,
        event_names=settings.event_names,
        start_date=settings.start_date,
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        outcome_rows = filtering.outcome_counts(marked).collect()
        window.unpersist()  # `marked` is filled: nothing reads the window again
        # Load days whose input changed reach later, already materialized load days.
        changed = [
            d
            for d in days
            if previous.get(d) is None
            or previous[d].events_fingerprint != fingerprints.get(d, EMPTY_FINGERPRINT)
        ]
        reached: list[dt.date] = []
        later_materialized = [
            d
            for d in previous
            if d not in days and any(c < d <= c + dt.timedelta(days=n) for c in changed)
        ]
        if changed and later_materialized and n > 0:
            ids = marked.filter(F.col(LOAD_DATE).isin(changed)).select(LOAD_DATE, "event_id")
            if _exists(tables.filtered_events):
                old = spark.read.format("delta").load(tables.filtered_events)
                ids = ids.unionByName(
                    old.filter(F.col(LOAD_DATE).isin(changed)).select(LOAD_DATE, "event_id")
                )
            later = events.filter(F.col(LOAD_DATE).isin(later_materialized))
            reached = sorted(
                r[LOAD_DATE] for r in filtering.load_days_reached(ids, later, n).collect()
            )
        kept = filtering.kept_rows(marked).repartition(LOAD_DATE, EVENT_DATE)
        # --- the processing-manifest lock wraps from here (see `guarded`)
        replace_partitions(
            spark,
            kept,
            tables.filtered_events,
            LOAD_DATE,
            days,
            [LOAD_DATE, EVENT_DATE],
            properties={"delta.enableChangeDataFeed": "true"},
        )
    finally:
        marked.unpersist()
        window.unpersist()

    per_day: dict[dt.date, dict[str, int]] = defaultdict(dict)
    max_loaded: dict[dt.date, dt.datetime] = {}
    for r in outcome_rows:
        per_day[r[LOAD_DATE]][r["outcome"]] = r["rows"]
        if r["max_load_tstamp"] is not None:
            stamp = _utc(r["max_load_tstamp"])
            max_loaded[r[LOAD_DATE]] = max(stamp, max_loaded.get(r[LOAD_DATE], stamp))
    materialization = uuid.uuid4().hex
    materialized_at = dt.datetime.now(dt.UTC)
    accounting_rows = []
    accounts: dict[str, dict[str, int]] = {}
    for day in days:
        acc = filtering.accounting(per_day.get(day, {}))
        accounts[day.isoformat()] = acc
        if day not in has_events and day not in had_rows:
            continue  # a load day without data is done without a record
        accounting_rows.append(
            {
                LOAD_DATE: day,
                "events_fingerprint": fingerprints.get(day, EMPTY_FINGERPRINT),
                **acc,
                "max_load_tstamp": max_loaded.get(day),
                "materialization_id": materialization,
                "materialized_at": materialized_at,
            }
        )
    for day in reached:
        old_row = previous[day]
        accounting_rows.append(
            {
                LOAD_DATE: day,
                "events_fingerprint": "redo: reached by duplicates of "
                + ", ".join(c.isoformat() for c in changed),
                "rows_read": old_row.rows_read,
                "rows_kept": old_row.rows_kept,
                **{c: old_row.dropped.get(c[len("dropped_") :], 0) for c in DROP_COLUMNS},
                "max_load_tstamp": old_row.max_load_tstamp,
                "materialization_id": old_row.materialization_id,
                "materialized_at": old_row.materialized_at,
            }
        )
    upsert_small(tables.accounting, accounting_rows, ACCOUNTING_SCHEMA, LOAD_DATE)

    files_read, files_total = files_in(
        tables.events,
        LOAD_DATE,
        [first + dt.timedelta(days=i) for i in range((last - first).days + 1)],
    )
    total = {k: sum(a[k] for a in accounts.values()) for k in next(iter(accounts.values()))}
    result.used_spark = True
    result.metadata.update(
        {
            "rows read": total["rows_read"],
            "rows written": total["rows_kept"],
            **{k.replace("_", " "): v for k, v in total.items() if k.startswith("dropped_")},
            "accounting per load day": accounts,
            "events files read": files_read,
            "events files in table": files_total,
            "later load days reached by duplicates (marked pending)": [
                d.isoformat() for d in reached
            ],
            "time taken (s)": round(time.monotonic() - started, 3),
        }
    )
    result.facts = {"accounting": accounts, "reached": reached}
    return result


# ------------------------------------------------------------------------- days_to_process

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


def days_to_process_step(
    tables: TimeBasedTables,
    settings: Settings,
    load_days: Sequence[dt.date],
    now: dt.datetime,
) -> StepResult:
    """Decide the event days of load days, in ascending order; replace exactly their rows.

    Reads no event data and starts no Spark job: rows per (load day, event day) come from
    filtered_events' Delta log, and the decisions are written with delta-rs.
    """
    started = time.monotonic()
    days = sorted(set(load_days))
    state = read_state(tables)
    result = StepResult(metadata=_limits_metadata(state, settings, now))
    result.metadata["load days"] = ", ".join(d.isoformat() for d in days)
    horizons = decided_horizons(
        ((r.load_date, r.event_date, r.decision) for r in state.decisions),
        {d: a.horizon for d, a in state.aggregated.items()},
    )
    previous: dict[dt.date, list[dt.date]] = defaultdict(list)
    for r in state.decisions:
        previous[r.load_date].append(r.event_date)
    decisions = decide_load_days(
        days,
        state.counts,
        horizons,
        settings.reprocess_days,
        settings.min_rows_to_process,
        previous_event_days=previous,
    )
    decided_at = dt.datetime.now(dt.UTC)
    had_rows = any(d in previous for d in days)
    if decisions or had_rows:
        rows = [
            {
                LOAD_DATE: x.load_date,
                EVENT_DATE: x.event_date,
                "rows": x.rows,
                "is_late": x.is_late,
                "horizon_before": x.horizon_before,
                "pending": x.pending,
                "decision": x.decision.value,
                "reason": x.reason,
                "decided_at": decided_at,
                "filtered_materialization_id": (
                    state.accounting[x.load_date].materialization_id
                    if x.load_date in state.accounting
                    else ""
                ),
                "max_load_tstamp": (
                    state.accounting[x.load_date].max_load_tstamp
                    if x.load_date in state.accounting
                    else None
                ),
            }
            for x in decisions
        ]
        # --- the processing-manifest lock wraps from here (see `guarded`)
        replace_small(tables.days_to_process, rows, DECISIONS_SCHEMA, LOAD_DATE, days, [LOAD_DATE])
        result.metadata["written with"] = "delta-rs (no Spark job)"

    processed = [x for x in decisions if x.decision == "process"]
    skipped = [x for x in decisions if x.decision == "skip"]
    requested = event_days_to_request(decisions)
    result.metadata.update(
        {
            "rows read": sum(x.rows for x in decisions),
            "rows written": len(decisions),
            "event days processed": len({x.event_date for x in processed}),
            "event days skipped": len({x.event_date for x in skipped}),
            "decisions": [
                {
                    "load day": x.load_date.isoformat(),
                    "event day": x.event_date.isoformat(),
                    "rows": x.rows,
                    "pending": x.pending,
                    "decision": x.decision.value,
                    "reason": x.reason,
                }
                for x in decisions
            ],
            "skipped event days (pending rows)": {
                x.event_date.isoformat(): x.pending for x in skipped
            },
            "daily_aggregates partitions requested": [d.isoformat() for d in requested],
            "time taken (s)": round(time.monotonic() - started, 3),
        }
    )
    if not decisions and not had_rows:
        result.metadata["note"] = "no rows in these load days: nothing to decide"
    result.facts = {"decisions": decisions, "requested": requested}
    return result


# ------------------------------------------------------------------------ daily_aggregates

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


def aggregation_horizons(
    state: TimeBasedState,
    counts: Mapping[tuple[dt.date, dt.date], int],
    event_days: Iterable[dt.date],
    all_loaded_rows: bool,
) -> dict[dt.date, dt.date | None]:
    """The horizon each event day is recomputed up to: the decided one, or (keyhole repair) the
    last load day holding rows of it, whichever is later."""
    decided = decided_horizons(
        ((r.load_date, r.event_date, r.decision) for r in state.decisions),
        {d: a.horizon for d, a in state.aggregated.items()},
    )
    out: dict[dt.date, dt.date | None] = {}
    for day in event_days:
        horizon = decided.get(day)
        if all_loaded_rows:
            loaded = [ld for (ld, d), rows in counts.items() if d == day and rows > 0]
            if loaded and (horizon is None or max(loaded) > horizon):
                horizon = max(loaded)
        out[day] = horizon
    return out


def daily_aggregates_step(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    event_days: Sequence[dt.date],
    all_loaded_rows: bool = False,
) -> StepResult:
    """Recompute event days in full from their rows with load day <= horizon; replace exactly
    their rows. `all_loaded_rows`: a keyhole repair that counts every row loaded so far."""
    started = time.monotonic()
    days = sorted(set(event_days))
    state = read_state(tables)
    version, counts = partition_counts(tables.filtered_events)
    horizons = aggregation_horizons(state, counts, days, all_loaded_rows)
    latest = latest_process_decisions(state.decisions)
    result = StepResult()
    result.metadata["event days"] = ", ".join(d.isoformat() for d in days)
    result.metadata["mode"] = (
        "keyhole repair: every row loaded so far"
        if all_loaded_rows
        else "up to the decided horizon"
    )
    existing = state.daily_aggregates_version is not None
    with_rows = [d for d in days if horizons[d] is not None]
    aggregated_at = dt.datetime.now(dt.UTC)
    rows_counted = {d: rows_up_to_horizon(counts, d, horizons[d]) for d in days}
    files_read = 0
    if with_rows or existing:
        source = (
            spark.read.format("delta").option("versionAsOf", version).load(tables.filtered_events)
            if version is not None
            else _empty_filtered(spark)
        )
        horizon_df = spark.createDataFrame(
            [(d, horizons[d]) for d in with_rows],
            T.StructType(
                [
                    T.StructField(EVENT_DATE, T.DateType()),
                    T.StructField("_horizon_load_date", T.DateType()),
                ]
            ),
        )
        # Inside `sessionize run` the event days read here are kept for the session branch
        # (resources/shared_reads.py); they are then persisted already and released by the run.
        rows, shared = (
            shared_reads.event_days(source, tables.filtered_events, version, with_rows)
            if with_rows
            else (source.limit(0), False)
        )
        rows = rows.join(F.broadcast(horizon_df), on=EVENT_DATE).filter(
            F.col(LOAD_DATE) <= F.col("_horizon_load_date")
        )
        if not shared:
            # Kept while the aggregate runs: it reads the rows twice (the counts per event name,
            # the rest), and Spark would otherwise scan filtered_events twice.
            rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        if with_rows and version is not None:
            files_read, _ = files_in(tables.filtered_events, EVENT_DATE, with_rows, version)
        daily = (
            agg.daily_aggregates(rows, settings.user_identifier, settings.attributes)
            .join(F.broadcast(horizon_df), on=EVENT_DATE, how="left")
            .withColumn("_aggregated_at", F.lit(aggregated_at).cast("timestamp"))
            .select(
                *agg.BASE_COLUMNS,
                *[agg.attribute_column(d) for d in settings.attributes],
                "_horizon_load_date",
                "_aggregated_at",
            )
        )
        # --- the processing-manifest lock wraps from here (see `guarded`)
        try:
            replace_partitions(
                spark,
                daily.repartition(EVENT_DATE),
                tables.daily_aggregates,
                EVENT_DATE,
                days,
                [EVENT_DATE],
            )
        finally:
            if not shared:
                rows.unpersist()
        records = [
            {
                EVENT_DATE: d,
                "horizon_load_date": horizons[d],
                "rows_aggregated": rows_counted[d],
                "decided_through": latest.get(d),
                "aggregated_at": aggregated_at,
                "all_loaded_rows": all_loaded_rows,
            }
            for d in days
        ]
        upsert_small(tables.horizons, records, HORIZONS_SCHEMA, EVENT_DATE)
        result.used_spark = True
    _, written_actions = _add_actions(tables.daily_aggregates)
    written = sum(
        a["num_records"] or 0
        for a in written_actions
        if _as_date(a[f"partition.{EVENT_DATE}"]) in set(days)
    )
    pending_after = {
        d.isoformat(): sum(
            r
            for (ld, dd), r in counts.items()
            if dd == d and (horizons[d] is None or ld > horizons[d])
        )
        for d in days
    }
    result.metadata.update(
        {
            "rows read": sum(rows_counted.values()),
            "rows written": written,
            "horizons": {
                d.isoformat(): (h.isoformat() if h else None) for d, h in horizons.items()
            },
            "rows counted per event day": {d.isoformat(): r for d, r in rows_counted.items()},
            "pending rows after (not counted yet)": pending_after,
            "filtered_events files read": files_read,
            "filtered_events version read": version if version is not None else -1,
            "time taken (s)": round(time.monotonic() - started, 3),
        }
    )
    if not result.used_spark:
        result.metadata["note"] = "nothing decided for these event days: done without a Spark job"
    result.facts = {"horizons": horizons, "rows": rows_counted}
    return result


def _empty_filtered(spark: SparkSession) -> DataFrame:
    from sessionize_assets.core.schema import REQUIRED_COLUMNS, TIMESTAMP_COLUMNS

    fields = [
        T.StructField(c, T.TimestampType() if c in TIMESTAMP_COLUMNS else T.StringType())
        for c in REQUIRED_COLUMNS
    ]
    fields += [T.StructField(LOAD_DATE, T.DateType()), T.StructField(EVENT_DATE, T.DateType())]
    return spark.createDataFrame([], T.StructType(fields))


# ------------------------------------------------------------------ manifest and attributes

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


def manifest_step(tables: TimeBasedTables) -> StepResult:
    """Rewrite daily_aggregation_manifest from the state (no event data read, no Spark job)."""
    started = time.monotonic()
    rows = read_state(tables).manifest()
    replace_small(tables.manifest, [dataclasses.asdict(r) for r in rows], MANIFEST_SCHEMA)
    pending = {r.event_date.isoformat(): r.pending for r in rows if r.pending}
    return StepResult(
        metadata={
            "rows read": sum(r.rows_loaded for r in rows),
            "rows written": len(rows),
            "event days": len(rows),
            "event days with pending rows": len(pending),
            "pending rows": sum(pending.values()),
            "pending rows per event day": pending,
            "event days awaiting aggregation": [
                r.event_date.isoformat() for r in rows if r.awaiting_aggregation
            ],
            "event days not accounted": [r.event_date.isoformat() for r in rows if not r.accounted],
            "time taken (s)": round(time.monotonic() - started, 3),
        },
        facts={"rows": rows},
    )


def attributes_step(
    spark: SparkSession, tables: TimeBasedTables, settings: Settings, as_of: dt.date
) -> StepResult:
    """Drop and recompute attributes from daily_aggregates, as of a day."""
    started = time.monotonic()
    source = _delta_table(tables.daily_aggregates)
    version = source.version() if source is not None else None
    if version is None:
        return StepResult(
            metadata={"rows read": 0, "rows written": 0, "note": "no daily_aggregates yet"}
        )
    daily = spark.read.format("delta").option("versionAsOf", version).load(tables.daily_aggregates)
    out = attrs.attributes(daily, as_of, settings.attribute_windows_days, settings.attributes)
    (
        out.coalesce(1)
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option(
            "userMetadata",
            json.dumps({"daily_aggregates_version": version, "as_of": as_of.isoformat()}),
        )
        .save(tables.attributes)
    )
    _, read_actions = _add_actions(tables.daily_aggregates, version)
    _, written_actions = _add_actions(tables.attributes)
    return StepResult(
        used_spark=True,
        metadata={
            "rows read": sum(a["num_records"] or 0 for a in read_actions),
            "rows written": sum(a["num_records"] or 0 for a in written_actions),
            "as_of": as_of.isoformat(),
            "windows (days)": list(settings.attribute_windows_days),
            "configured attributes": [d.name for d in settings.attributes],
            "daily_aggregates version read": version,
            "time taken (s)": round(time.monotonic() - started, 3),
        },
    )


# ------------------------------------------------------------------------------ the assets


class DailyAggregatesConfig(Config):
    """`all_loaded_rows`: recompute with every row loaded so far (keyhole repair). Default: only
    for runs of a Dagster backfill of daily_aggregates itself."""

    all_loaded_rows: bool | None = None


def guarded(
    context: AssetExecutionContext,
    asset_name: str,
    keys: Sequence[str],
    body: Callable[[], StepResult],
) -> MaterializeResult:
    """The one place every partitioned materialization of this branch runs through: the
    processing-manifest lock on items `<asset>/<partition>` wraps `body` here."""
    with partition_locks(context, asset_name, keys) as payloads:
        result = body()
        for payload in payloads:
            payload.update({"run_keys": list(keys), **_payload_facts(result.metadata)})
    context.log.info(
        f"{asset_name} {', '.join(keys)}: {json.dumps(result.metadata, default=str)[:2000]}"
    )
    return MaterializeResult(metadata=result.dagster_metadata())


def _payload_facts(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar facts of a materialization, for the Processed record's payload."""
    return {str(k): v for k, v in metadata.items() if isinstance(v, int | float | str | bool)}


def _keys_as_days(context: AssetExecutionContext) -> list[dt.date]:
    return [dt.date.fromisoformat(k) for k in context.partition_keys]


def is_keyhole_run(tags: Mapping[str, str], configured: bool | None) -> bool:
    """A run of daily_aggregates is a keyhole repair when configured so, or (by default) when it is
    part of a Dagster backfill not launched by the late-days sensor."""
    if configured is not None:
        return configured
    return "dagster/backfill" in tags and REQUESTED_BY_TAG not in tags


def build_assets(settings: Settings) -> list[AssetsDefinition]:
    """filtered_events, days_to_process, daily_aggregates, daily_aggregation_manifest, attributes."""
    daily = daily_partitions(settings)
    lineage = late_day_lineage(settings)
    policy = BackfillPolicy.multi_run(max_partitions_per_run=settings.backfill_limit_days)

    @asset(
        name="filtered_events",
        partitions_def=daily,
        deps=[AssetDep("events")],
        backfill_policy=policy,
        group_name=GROUP,
        kinds={"spark", "delta"},
        description=(
            "Rows of `events` of a load day, filtered (app_ids, event_names, start_date), with "
            "event_date, deduplicated on event_id within the day and against the previous "
            "dedupe_lookback_days load days. Partitioned by load_date and event_date."
        ),
    )
    def filtered_events(
        context: AssetExecutionContext, lake: LakeResource, spark: SparkDeltaResource
    ) -> MaterializeResult:
        days = _keys_as_days(context)
        return guarded(
            context,
            "filtered_events",
            context.partition_keys,
            lambda: filtered_events_step(
                spark.get_session(),
                TimeBasedTables.at(lake.table),
                lake.settings,
                days,
                lake.current_time(),
            ),
        )

    @asset(
        name="days_to_process",
        partitions_def=daily,
        deps=[AssetDep("filtered_events")],
        backfill_policy=policy,
        group_name=GROUP,
        kinds={"delta"},
        description=(
            "For each event day a load day touches: rows, lateness, pending rows and the decision "
            "to (re)aggregate it or skip it (reprocess_days, min_rows_to_process)."
        ),
    )
    def days_to_process(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        days = _keys_as_days(context)
        return guarded(
            context,
            "days_to_process",
            context.partition_keys,
            lambda: days_to_process_step(
                TimeBasedTables.at(lake.table), lake.settings, days, lake.current_time()
            ),
        )

    @asset(
        name="daily_aggregates",
        partitions_def=daily,
        deps=[
            AssetDep("filtered_events", partition_mapping=lineage),
            AssetDep("days_to_process", partition_mapping=lineage),
        ],
        backfill_policy=policy,
        group_name=GROUP,
        kinds={"spark", "delta"},
        description=(
            "One row per (user, event day), recomputed in full from the rows of the day up to its "
            "horizon. A Dagster backfill of this asset is a keyhole repair (every row loaded so far)."
        ),
    )
    def daily_aggregates(
        context: AssetExecutionContext,
        config: DailyAggregatesConfig,
        lake: LakeResource,
        spark: SparkDeltaResource,
    ) -> MaterializeResult:
        days = _keys_as_days(context)
        keyhole = is_keyhole_run(context.run.tags, config.all_loaded_rows)
        return guarded(
            context,
            "daily_aggregates",
            context.partition_keys,
            lambda: daily_aggregates_step(
                spark.get_session(), TimeBasedTables.at(lake.table), lake.settings, days, keyhole
            ),
        )

    @asset(
        name="daily_aggregation_manifest",
        deps=[AssetDep("days_to_process"), AssetDep("daily_aggregates")],
        group_name=GROUP,
        kinds={"delta"},
        description="Per event day: rows aggregated, pending, skipped so far, horizon, last processed at.",
    )
    def daily_aggregation_manifest(lake: LakeResource) -> MaterializeResult:
        result = manifest_step(TimeBasedTables.at(lake.table))
        return MaterializeResult(metadata=result.dagster_metadata())

    @asset(
        name="attributes",
        deps=[AssetDep("daily_aggregates")],
        group_name=GROUP,
        kinds={"spark", "delta"},
        description="Per user: lifetime and last-N-days metrics and configured attributes, dropped and recomputed.",
    )
    def attributes(lake: LakeResource, spark: SparkDeltaResource) -> MaterializeResult:
        as_of = lake.current_time().date()
        result = attributes_step(
            spark.get_session(), TimeBasedTables.at(lake.table), lake.settings, as_of
        )
        return MaterializeResult(metadata=result.dagster_metadata())

    return [
        filtered_events,
        days_to_process,
        daily_aggregates,
        daily_aggregation_manifest,
        attributes,
    ]
