"""Asset checks of the time-based branch: deduplication of filtered_events and the accounting
invariant of daily_aggregates (SPEC section 5), with daily_aggregates' one row per (user, event
day), which `attributes` relies on (it counts a user's rows as active days)."""

# No `from __future__ import annotations`: Dagster reads the check's `context` annotation as a
# class, not a string.
import datetime as dt
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)
from pyspark.sql import SparkSession

from sessionize_assets.core.aggregates import USER_IDENTIFIER
from sessionize_assets.core.filtering import (
    duplicate_copies,
    duplicate_event_ids,
    duplicate_event_ids_touching,
)
from sessionize_assets.core.late_days import accounting_differences
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.resources.delta import (
    data_skipping_when_it_pays,
    delta_table,
    read_version,
)
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.settings import Settings
from sessionize_assets.time_based.state import partition_counts, read_state
from sessionize_assets.time_based.tables import TimeBasedTables

EXAMPLES = 20
# A duplicates check over up to this many rows of filtered_events runs on the driver (delta-rs and
# Arrow read two columns; no Spark job and no Delta snapshot); a larger one runs in Spark.
DRIVER_CHECK_ROWS = 5_000_000
DRIVER_ROWS_READ = "event rows read on the driver"
# Dagster's run tags for a partition range (the command line sets them on its range runs).
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


@dataclass(frozen=True)
class DuplicatesScan:
    """What a duplicates check reads: filtered_events at `version`, the load days `read` (all
    when None) and their `rows`."""

    version: int | None
    read: tuple[dt.date, dt.date] | None
    rows: int

    def on_driver(self, driver_rows: int = DRIVER_CHECK_ROWS) -> bool:
        return self.rows <= driver_rows


def duplicates_scan(
    path: str, dedupe_lookback_days: int, load_days: tuple[dt.date, dt.date] | None = None
) -> DuplicatesScan:
    """The load days a check of `load_days` reads (first - lookback .. last + lookback: where
    the other copy can be) and their rows, from the Delta log's row counts (`partition_counts`,
    no data read)."""
    version, counts = partition_counts(path)
    lookback = dt.timedelta(days=dedupe_lookback_days)
    read = None if load_days is None else (load_days[0] - lookback, load_days[1] + lookback)
    rows = sum(
        n for (load_day, _), n in counts.items() if read is None or read[0] <= load_day <= read[1]
    )
    return DuplicatesScan(version, read, rows)


def duplicates_in_filtered_events(
    spark: SparkSession,
    tables: TimeBasedTables,
    dedupe_lookback_days: int,
    load_days: tuple[dt.date, dt.date] | None = None,
    configured: Mapping[str, str] | None = None,
    driver_rows: int = DRIVER_CHECK_ROWS,
    scan: DuplicatesScan | None = None,
) -> list[str]:
    """Copies of an event_id kept within dedupe_lookback_days load days of each other; with
    `load_days` (first, last), only copies of which one is in those load days. Up to
    `driver_rows` rows in the load days read (`duplicates_scan`, or `scan` when given) are
    checked on the driver from their event ids (delta-rs, no Spark); more in Spark.
    `configured`: the user's `spark` settings (data skipping is used only where it pays, unless
    set there)."""
    path = tables.filtered_events
    scan = scan or duplicates_scan(path, dedupe_lookback_days, load_days)
    if scan.version is None:
        return []
    if scan.on_driver(driver_rows):
        rows = repeated_event_ids(path, scan.version, scan.read)
        found = duplicate_copies(rows, dedupe_lookback_days, load_days)
    else:
        found = _duplicates_in_spark(
            spark, path, scan.version, dedupe_lookback_days, load_days, configured
        )
    return [
        f"event_id {event_id} kept in load days {day} and {other}"
        for event_id, day, other in found[:EXAMPLES]
    ]


def repeated_event_ids(
    path: str, version: int, load_days: tuple[dt.date, dt.date] | None
) -> list[tuple[str, dt.date]]:
    """(event_id, load_date) of the rows in `load_days` (all when None) whose event_id (not
    null) is kept more than once there: only those reach Python, the rest stay in Arrow."""
    table = delta_table(path, version)
    partitions = (
        None
        if load_days is None
        else [
            (LOAD_DATE, ">=", load_days[0].isoformat()),
            (LOAD_DATE, "<=", load_days[1].isoformat()),
        ]
    )
    rows = table.to_pyarrow_table(columns=["event_id", LOAD_DATE], partitions=partitions)
    rows = rows.filter(pc.is_valid(rows["event_id"]))  # null ids are never duplicates
    counts = rows.group_by("event_id").aggregate([(LOAD_DATE, "count")])
    repeated = counts.filter(pc.greater(counts[f"{LOAD_DATE}_count"], 1))["event_id"]
    rows = rows.filter(pc.is_in(rows["event_id"], value_set=repeated))
    return list(zip(rows["event_id"].to_pylist(), rows[LOAD_DATE].to_pylist(), strict=True))


def _duplicates_in_spark(
    spark: SparkSession,
    path: str,
    version: int,
    dedupe_lookback_days: int,
    load_days: tuple[dt.date, dt.date] | None,
    configured: Mapping[str, str] | None,
) -> list[tuple[str | None, dt.date, dt.date]]:
    filtered = read_version(spark, path, version)
    if load_days is None:
        found = duplicate_event_ids(filtered, dedupe_lookback_days)
    else:
        found = duplicate_event_ids_touching(filtered, dedupe_lookback_days, *load_days)
    found = found.orderBy("event_id", LOAD_DATE, "other_load_date").limit(EXAMPLES)
    with data_skipping_when_it_pays(spark, [path], configured):
        rows = found.collect()
    return [(r.event_id, r[LOAD_DATE], r.other_load_date) for r in rows]


def daily_rows(tables: TimeBasedTables) -> pa.Table | None:
    """The columns of daily_aggregates the accounting check needs, read once (delta-rs, no
    Spark); None when the table does not exist yet."""
    table = delta_table(tables.daily_aggregates)
    if table is None:
        return None
    return table.to_pyarrow_table(
        columns=[USER_IDENTIFIER, EVENT_DATE, "total_events", "_horizon_load_date"]
    )


def counted_per_event_day(rows: pa.Table | None) -> dict:
    """{event day: (sum of total_events, horizon recorded)} from `daily_rows`."""
    if rows is None:
        return {}
    per_day = rows.group_by(EVENT_DATE).aggregate(
        [("total_events", "sum"), ("_horizon_load_date", "max")]
    )
    return {
        r[EVENT_DATE]: (int(r["total_events_sum"] or 0), r["_horizon_load_date_max"])
        for r in per_day.to_pylist()
    }


def repeated_user_days(rows: pa.Table | None) -> list[str]:
    """The (user, event day) pairs of `daily_rows` held more than once (first examples, in
    order). A null user is one user: its rows are one row too."""
    if rows is None:
        return []
    counts = rows.group_by([USER_IDENTIFIER, EVENT_DATE]).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1)).to_pylist()
    repeated.sort(key=lambda r: (r[EVENT_DATE], r[USER_IDENTIFIER] is None, r[USER_IDENTIFIER]))
    return [
        f"user {'(null)' if r[USER_IDENTIFIER] is None else r[USER_IDENTIFIER]} has "
        f"{r['count_all']} rows on event day {r[EVENT_DATE]}"
        for r in repeated[:EXAMPLES]
    ]


def accounting_invariant(tables: TimeBasedTables) -> list[str]:
    """Per event day: rows in filtered_events = rows counted into daily_aggregates + pending;
    and one daily_aggregates row per (user, event day)."""
    _, counts = partition_counts(tables.filtered_events)
    rows = daily_rows(tables)
    return accounting_differences(counts, counted_per_event_day(rows)) + repeated_user_days(rows)


def run_load_days(context: AssetCheckExecutionContext) -> tuple[dt.date, dt.date] | None:
    """The load days of the run the check executes in (a partition or a range), None when the
    run names none (a check launched on its own checks the whole table)."""
    if context.has_partition_key:
        day = dt.date.fromisoformat(context.partition_key)
        return day, day
    if context.has_partition_key_range:
        keys = context.partition_key_range
        return dt.date.fromisoformat(keys.start), dt.date.fromisoformat(keys.end)
    return None


def build_checks(settings: Settings) -> list[AssetChecksDefinition]:
    """`no_duplicate_event_ids` on filtered_events, `accounting_invariant` on daily_aggregates."""

    @asset_check(
        asset="filtered_events",
        name="no_duplicate_event_ids",
        description=(
            "No event_id is kept twice in filtered_events within any window of "
            "dedupe_lookback_days load days. In a run over load days, the copies that involve "
            "those load days; launched on its own, the whole table."
        ),
    )
    def no_duplicate_event_ids(
        context: AssetCheckExecutionContext, lake: LakeResource, spark: SparkDeltaResource
    ) -> AssetCheckResult:
        load_days = run_load_days(context)
        tables = TimeBasedTables.at(lake.table)
        lookback = lake.settings.dedupe_lookback_days
        scan = duplicates_scan(tables.filtered_events, lookback, load_days)
        found = duplicates_in_filtered_events(
            spark.get_session(), tables, lookback, load_days, lake.settings.spark, scan=scan
        )
        scope = (
            "all load days" if load_days is None else f"load days {load_days[0]}..{load_days[1]}"
        )
        return AssetCheckResult(
            passed=not found,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "duplicates (first examples)": MetadataValue.json(found),
                "dedupe_lookback_days": MetadataValue.int(lake.settings.dedupe_lookback_days),
                "checked": MetadataValue.text(scope),
                # What it read outside Spark (the benchmark adds it to the rows read).
                DRIVER_ROWS_READ: MetadataValue.int(scan.rows if scan.on_driver() else 0),
            },
        )

    @asset_check(
        asset="daily_aggregates",
        name="accounting_invariant",
        description=(
            "For every event day: rows in filtered_events = rows counted into daily_aggregates "
            "+ pending rows (loaded after its horizon), except days awaiting re-aggregation by "
            "a later run; and daily_aggregates holds one row per (user, event day), as "
            "attributes' active days assume. Blocking: a run whose daily_aggregates break it "
            "fails before anything downstream reads them."
        ),
        blocking=True,
    )
    def accounting_invariant_check(lake: LakeResource) -> AssetCheckResult:
        tables = TimeBasedTables.at(lake.table)
        # A command's runs re-aggregate their event days one range after another: a day a later
        # run will redo (a rewritten load day took its rows away) holds only once that run is
        # done, so the days awaiting re-aggregation are left out (delta-rs reads, no Spark).
        state = read_state(tables)
        awaiting = sorted(state.outstanding())
        counts = state.counts  # filtered_events' rows per (load day, event day), from its log
        daily = daily_rows(tables)
        counted = counted_per_event_day(daily)
        differences = accounting_differences(counts, counted, set(awaiting))
        repeated = repeated_user_days(daily)
        pending: dict[str, int] = defaultdict(int)
        for (load_day, event_day), rows in counts.items():
            horizon = counted.get(event_day, (0, None))[1]
            if horizon is None or load_day > horizon:
                pending[event_day.isoformat()] += rows
        return AssetCheckResult(
            passed=not differences and not repeated,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "differences": MetadataValue.json(differences[:EXAMPLES]),
                "(user, event day) rows repeated (first examples)": MetadataValue.json(repeated),
                "event days checked": MetadataValue.int(
                    len({d for (_, d) in counts} | set(counted))
                ),
                "pending rows (reported, not a difference)": MetadataValue.int(
                    sum(pending.values())
                ),
                "pending rows per event day": MetadataValue.json(dict(sorted(pending.items()))),
                "event days awaiting re-aggregation (row counts not checked)": MetadataValue.json(
                    [d.isoformat() for d in awaiting]
                ),
            },
        )

    return [no_duplicate_event_ids, accounting_invariant_check]
