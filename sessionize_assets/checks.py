"""Asset checks of the time-based branch: deduplication of filtered_events and the accounting
invariant of daily_aggregates (SPEC section 5)."""

# No `from __future__ import annotations`: Dagster reads the check's `context` annotation as a
# class, not a string.
import datetime as dt
from collections import defaultdict
from collections.abc import Mapping

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core.filtering import duplicate_event_ids, duplicate_event_ids_touching
from sessionize_assets.core.late_days import accounting_differences
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.resources.delta import data_skipping_when_it_pays, read_table
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark import SparkDeltaResource
from sessionize_assets.settings import Settings
from sessionize_assets.time_based.state import partition_counts, read_state
from sessionize_assets.time_based.tables import TimeBasedTables

EXAMPLES = 20
# Dagster's run tags for a partition range (the command line sets them on its range runs).
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


def duplicates_in_filtered_events(
    spark: SparkSession,
    tables: TimeBasedTables,
    dedupe_lookback_days: int,
    load_days: tuple[dt.date, dt.date] | None = None,
    configured: Mapping[str, str] | None = None,
) -> list[str]:
    """Copies of an event_id kept within dedupe_lookback_days load days of each other; with
    `load_days` (first, last), only copies of which one is in those load days. `configured`:
    the user's `spark` settings (data skipping is used only where it pays, unless set there)."""
    filtered = read_table(spark, tables.filtered_events)
    if filtered is None:
        return []
    if load_days is None:
        found = duplicate_event_ids(filtered, dedupe_lookback_days)
    else:
        found = duplicate_event_ids_touching(filtered, dedupe_lookback_days, *load_days)
    found = found.orderBy("event_id", LOAD_DATE).limit(EXAMPLES)
    with data_skipping_when_it_pays(spark, [tables.filtered_events], configured):
        rows = found.collect()
    return [
        f"event_id {r.event_id} kept in load days {r[LOAD_DATE]} and {r.other_load_date}"
        for r in rows
    ]


def counted_per_event_day(spark: SparkSession, tables: TimeBasedTables) -> dict:
    """{event day: (sum of total_events, horizon recorded)} from daily_aggregates."""
    daily = read_table(spark, tables.daily_aggregates)
    if daily is None:
        return {}
    rows = daily.groupBy(EVENT_DATE).agg(
        F.sum("total_events").alias("rows"), F.max("_horizon_load_date").alias("horizon")
    )
    return {r[EVENT_DATE]: (int(r["rows"] or 0), r["horizon"]) for r in rows.collect()}


def accounting_invariant(spark: SparkSession, tables: TimeBasedTables) -> list[str]:
    """Per event day: rows in filtered_events = rows counted into daily_aggregates + pending."""
    _, counts = partition_counts(tables.filtered_events)
    return accounting_differences(counts, counted_per_event_day(spark, tables))


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
        found = duplicates_in_filtered_events(
            spark.get_session(),
            TimeBasedTables.at(lake.table),
            lake.settings.dedupe_lookback_days,
            load_days,
            lake.settings.spark,
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
            },
        )

    @asset_check(
        asset="daily_aggregates",
        name="accounting_invariant",
        description=(
            "For every event day: rows in filtered_events = rows counted into daily_aggregates "
            "+ pending rows (loaded after its horizon), except days awaiting re-aggregation by "
            "a later run. Blocking: a run whose daily_aggregates break it fails before anything "
            "downstream reads them."
        ),
        blocking=True,
    )
    def accounting_invariant_check(
        lake: LakeResource, spark: SparkDeltaResource
    ) -> AssetCheckResult:
        tables = TimeBasedTables.at(lake.table)
        # A command's runs re-aggregate their event days one range after another: a day a later
        # run will redo (a rewritten load day took its rows away) holds only once that run is
        # done, so the days awaiting re-aggregation are left out (delta-rs reads, no Spark).
        awaiting = sorted(read_state(tables).outstanding())
        _, counts = partition_counts(tables.filtered_events)
        counted = counted_per_event_day(spark.get_session(), tables)
        differences = accounting_differences(counts, counted, set(awaiting))
        pending: dict[str, int] = defaultdict(int)
        for (load_day, event_day), rows in counts.items():
            horizon = counted.get(event_day, (0, None))[1]
            if horizon is None or load_day > horizon:
                pending[event_day.isoformat()] += rows
        return AssetCheckResult(
            passed=not differences,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "differences": MetadataValue.json(differences[:EXAMPLES]),
                "event days checked": MetadataValue.int(
                    len({d for (_, d) in counts} | set(counted))
                ),
                "pending rows (reported, not a difference)": MetadataValue.int(
                    sum(pending.values())
                ),
                "pending rows per event day": MetadataValue.json(dict(sorted(pending.items()))),
                "event days awaiting re-aggregation (not checked)": MetadataValue.json(
                    [d.isoformat() for d in awaiting]
                ),
            },
        )

    return [no_duplicate_event_ids, accounting_invariant_check]
