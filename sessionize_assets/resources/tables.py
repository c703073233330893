"""Delta table helpers: Spark reads and writes for data, delta-rs reads for small state tables."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from dagster import ConfigurableResource
from pyspark.sql import DataFrame, SparkSession

from sessionize_assets.home import Home

# Table names (the spec's, plus the project's own bookkeeping tables).
EVENTS = "events"
INVALID_EVENTS = "invalid_events"
LOAD_LOG = "load_log"
FILTERED_EVENTS = "filtered_events"
FILTERED_EVENTS_ACCOUNTING = "filtered_events_accounting"
DAYS_TO_PROCESS = "days_to_process"
DAILY_AGGREGATE_HORIZONS = "daily_aggregate_horizons"
DAILY_AGGREGATION_MANIFEST = "daily_aggregation_manifest"
DAILY_AGGREGATES = "daily_aggregates"
ATTRIBUTES = "attributes"
SESSIONS = "sessions"
USERS = "users"
SESSIONS_LIFECYCLE_MANIFEST = "sessions_lifecycle_manifest"
QUARANTINED_SESSIONS = "quarantined_sessions"
SUPERSEDED_SESSIONS = "superseded_sessions"
INCREMENTAL_MANIFEST = "incremental_manifest"
PROCESSING_MANIFEST = "processing_manifest"
CURSOR_STATE = "cursor_state"


def table_exists(spark: SparkSession, path: str) -> bool:
    """True if a Delta table is at `path`."""
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, path)


def read_table(spark: SparkSession, path: str) -> DataFrame | None:
    """The table as a DataFrame, or None when it does not exist yet."""
    if not table_exists(spark, path):
        return None
    return spark.read.format("delta").load(path)


def delta_version(path: str) -> int | None:
    """The table's current version via delta-rs (no Spark), or None when absent."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path).version()
    except TableNotFoundError:
        return None


def read_small_table(path: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """A small state table's rows as dicts via delta-rs (for sensors: no Spark). [] when absent."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path)
    except TableNotFoundError:
        return []
    return table.to_pyarrow_table(columns=list(columns) if columns else None).to_pylist()


def newest_value(path: str, column: str, for_nulls: str | None = None) -> Any:
    """The largest value of `column` in a Delta table, from the Delta log's file statistics (no
    data read), rounded up by 1 ms for timestamps (Delta keeps millisecond statistics). Files
    with nulls in `column` count with their largest `for_nulls` value. None when the table is
    absent or empty, or a statistic is missing (the caller must then assume anything)."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    except TableNotFoundError:
        return None
    if not actions:
        return None
    newest = None
    for file in actions:
        nulls = file.get(f"null_count.{column}")
        if nulls is None or file.get("num_records") is None:
            return None
        candidates = []
        if nulls < file["num_records"]:
            candidates.append(file.get(f"max.{column}"))
        if nulls > 0:
            if for_nulls is None:
                return None
            candidates.append(file.get(f"max.{for_nulls}"))
        if any(c is None for c in candidates):
            return None
        for value in candidates:
            newest = value if newest is None else max(newest, value)
    if isinstance(newest, dt.datetime):
        newest += dt.timedelta(milliseconds=1)
    return newest


class WarehouseResource(ConfigurableResource):
    """Where the tables are: the warehouse folder under the home (or an object-store URI)."""

    home: str

    def location(self, table: str) -> str:
        return Home(__import__("pathlib").Path(self.home)).table(table)
